"""The roots of one refresh of Shampoo's statistics, batched: one batched inverse root per
(size, p) group, computed in chunks of :data:`ROOT_CHUNK` matrices, with the eigh fallback
where coupled Newton rejects a matrix (:meth:`RootBatch._root`). What
:class:`~.rootwork.RootWork` computes synchronously and the root worker process
(:mod:`.rootproc`) in the background, with the same numbers.

Under data parallelism (``shard = (rank, W)``) the work is split in two halves:
:meth:`RootBatch.local` computes this rank's chunks only (the refresh's chunks assigned to
ranks by estimated cost, :func:`.rootsplit.assign`, from the shapes alone; no collective, so
a background worker can run it) and :meth:`RootBatch.exchange` hands every rank the others'
roots and statuses, one ``all_gather`` of one byte buffer per refresh, padded to the
longest rank's (:func:`owned_rows` says which rows each rank sends, from the same assignment).
A status travels with its root, so a rejected root (status 0: the previous root kept) is
decided once, by the rank that computed it, and every rank installs the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mloc.runtime.optim.roots import Roots, inverse_root, resolve
from mloc.runtime.optim.rootsplit import ROOT_CHUNK, assign, chunk_cost, chunks as _chunks

__all__ = ["ROOT_CHUNK", "RootBatch", "owned_chunks", "owned_rows", "refresh_groups"]


class RootBatch:
    """See the module docstring. ``shard``: ``(rank, world)`` under data parallelism."""

    def __init__(self, epsilon: float, method: str, shard: tuple[int, int] | None = None):
        self.epsilon, self.method = epsilon, method
        self.shard = shard
        self.computed = 0               # matrices whose roots this process computed (benchmarks)
        self.cost = 0                   # their estimated cost, padding included (rootsplit.chunk_cost)

    def compute(self, stats, ps) -> dict:
        """New roots and their status (1 accepted, 0 rejected, -1 an all-zero statistic:
        nothing to precondition by yet) for every statistic, one batched root per
        (size, p) group: :meth:`local`, then under data parallelism :meth:`exchange`."""
        done = self.local(stats, ps)
        return self.exchange(done, ps) if self.shard is not None and self.shard[1] > 1 else done

    @torch.no_grad()
    def local(self, stats, ps) -> dict:
        """:meth:`compute`'s result with only this rank's chunks computed (every chunk in one
        process): the other rows' roots are zeros and their status 0 or -1 until
        :meth:`exchange`."""
        groups = _groups(stats, ps)
        roots = [list(ss) for ss in stats]
        status = [list(ss) for ss in stats]
        world = self.shard[1] if self.shard is not None else 1
        plan = assign(refresh_groups(stats, ps), world) if world > 1 else None
        for g, ((_, p), items) in enumerate(groups.items()):
            parts = [stats[i][j].detach() for i, j in items]
            batch = parts[0] if len(parts) == 1 else torch.cat(parts)
            root, ok, all_ok = self._batched_root(batch, p, plan[g] if plan else None)
            if all_ok:                  # an accepted root's statistic is not zero
                code = torch.ones(batch.shape[0], dtype=torch.int8, device=batch.device)
            else:   # a PSD matrix is zero iff its trace is: no gradient has reached it yet
                empty = batch.diagonal(0, -2, -1).sum(-1) == 0
                code = torch.where(empty, -1, ok.to(torch.int8)).to(torch.int8)
            if len(items) == 1:
                (i, j), = items
                roots[i][j], status[i][j] = root, code
                continue
            sizes = [s.shape[0] for s in parts]
            for (i, j), r, c in zip(items, root.split(sizes), code.split(sizes)):
                roots[i][j], status[i][j] = r, c
        return {"roots": tuple(map(tuple, roots)), "status": tuple(map(tuple, status))}

    def _batched_root(self, batch: Tensor, p: int, owners=None) -> tuple[Tensor, Tensor, bool]:
        """``(roots, ok, all_ok)`` of a batch of ``n`` matrices (``all_ok``: every root is
        known accepted without a host read, :attr:`.roots.Roots.all_ok`), computed in chunks of
        ``min(ROOT_CHUNK, n)`` (the last padded with identities): every root is computed in a
        batch of the same shape whatever the process layout (CPU batched matmuls round
        differently for different batch sizes). Under data parallelism rank ``r`` computes
        the chunks whose ``owners`` entry is ``r`` (:func:`owned_chunks`; the group's row of
        :func:`.rootsplit.assign`; the others' rows zeros, not accepted) and
        :meth:`exchange` fills in the rest, so the roots equal one process's bit for bit."""
        n, size = batch.shape[0], batch.shape[-1]
        chunk, count = _chunks(n)
        rank, world = self.shard or (0, 1)
        if world == 1 or owners is None:
            rank, world, owners = 0, 1, (0,) * count
        if count == 1 and world == 1:
            r = self._root(batch, p)
            self.computed += n
            self.cost += chunk_cost(chunk, size)
            return r.root, r.ok, r.all_ok
        eye = torch.eye(size, dtype=batch.dtype, device=batch.device)
        padded = torch.cat([batch, eye.expand(count * chunk - n, -1, -1)]).view(count, chunk, size, size)
        mine = {c: self._root(padded[c], p) for c in owned_chunks(owners, rank)}
        self.computed += sum(min(chunk, n - c * chunk) for c in mine)
        self.cost += len(mine) * chunk_cost(chunk, size)
        if world == 1:
            return (torch.cat([r.root for r in mine.values()])[:n], torch.cat([r.ok for r in mine.values()])[:n],
                    all(r.all_ok for r in mine.values()))
        roots = torch.zeros_like(padded)
        oks = torch.zeros(count, chunk, dtype=torch.bool, device=batch.device)
        for c, r in mine.items():
            roots[c], oks[c] = r.root, r.ok
        return roots.view(-1, size, size)[:n], oks.view(-1)[:n], False

    def _root(self, chunk: Tensor, p: int) -> Roots:
        """The roots of one chunk. Where coupled Newton rejects a matrix, its eigh root is
        taken if eigh accepts it: eigh clamps the negative eigenvalues that rounding gives a
        singular float32 statistic (:mod:`.roots`), on which Newton's ridged matrix is
        indefinite and the iteration cannot converge; a non-finite input stays rejected."""
        r = inverse_root(chunk, p, epsilon=self.epsilon, method=self.method)
        if r.all_ok or resolve(self.method, chunk.device) != "newton" or bool(r.ok.all()):
            return r
        e = inverse_root(chunk, p, epsilon=self.epsilon, method="eigh")
        use = e.ok & ~r.ok
        return Roots(torch.where(use[..., None, None], e.root, r.root), r.ok | e.ok, r.error, r.iters)

    @torch.no_grad()
    def exchange(self, done: dict, ps) -> dict:
        """:meth:`local`'s result on every rank completed with the other ranks' rows: each
        rank's own rows (:func:`owned_rows`), roots and statuses as bytes, in one buffer
        padded to the longest rank's, one ``all_gather`` for the whole refresh."""
        import torch.distributed as dist
        rank, world = self.shard
        groups = _groups(done["roots"], ps)
        cats = [(torch.cat([done["roots"][i][j] for i, j in items]),
                 torch.cat([done["status"][i][j] for i, j in items])) for items in groups.values()]
        plan = assign(refresh_groups(done["roots"], ps), world)
        rows = [[owned_rows(r.shape[0], own, k) for (r, _), own in zip(cats, plan)] for k in range(world)]
        lengths = [sum(len(ix) * (r[0].numel() * r.element_size() + 1) for ix, (r, _) in zip(rk, cats))
                   for rk in rows]
        device = cats[0][0].device if cats else torch.device("cpu")
        payload = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
        mine = [_bytes(t[ix]) for ix, (r, s) in zip(rows[rank], cats) for t in (r, s)]
        if mine:
            torch.cat(mine, out=payload[:lengths[rank]])
        out = [torch.empty_like(payload) for _ in range(world)]
        dist.all_gather(out, payload)
        for k in range(world):
            if k == rank:
                continue
            at = 0
            for ix, (r, s) in zip(rows[k], cats):
                for t in (r, s):
                    size = len(ix) * t[0].numel() * t.element_size()
                    t[ix] = out[k][at:at + size].clone().view(t.dtype).view(len(ix), *t.shape[1:])
                    at += size
        roots = [list(ss) for ss in done["roots"]]
        status = [list(ss) for ss in done["status"]]
        for items, (r, s) in zip(groups.values(), cats):
            sizes = [done["roots"][i][j].shape[0] for i, j in items]
            for (i, j), rr, ss in zip(items, r.split(sizes), s.split(sizes)):
                roots[i][j], status[i][j] = rr, ss
        return {"roots": tuple(map(tuple, roots)), "status": tuple(map(tuple, status))}


def _groups(stats, ps) -> dict[tuple, list]:
    """The statistics' ``(i, j)`` by (size, p) group, in a fixed order (the statistics')."""
    groups: dict[tuple, list] = {}
    for i, ss in enumerate(stats):
        for j, s in enumerate(ss):
            groups.setdefault((s.shape[-1], ps[i]), []).append((i, j))
    return groups


def refresh_groups(stats, ps) -> list[tuple[int, int]]:
    """The refresh's (size, p) groups as ``(n, size)``, in :func:`_groups`' order: what
    :func:`.rootsplit.assign` splits (the roots' shapes are the statistics')."""
    return [(sum(stats[i][j].shape[0] for i, j in items), size) for (size, _), items in _groups(stats, ps).items()]


def owned_chunks(owners, rank: int) -> list[int]:
    """The chunks of a group whose roots ``rank`` computes, ``owners`` the group's row of
    :func:`.rootsplit.assign` (the rank of each chunk)."""
    return [c for c, owner in enumerate(owners) if owner == rank]


def owned_rows(n: int, owners, rank: int) -> torch.Tensor:
    """The real (unpadded) rows of :func:`owned_chunks` in a group of ``n`` matrices."""
    chunk, _ = _chunks(n)
    return torch.tensor([x for c in owned_chunks(owners, rank)
                         for x in range(c * chunk, min(n, (c + 1) * chunk))], dtype=torch.long)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)
