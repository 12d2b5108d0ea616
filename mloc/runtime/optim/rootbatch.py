"""The roots of one refresh of Shampoo's statistics, batched: one batched inverse root per
(size, p) group, computed in chunks of :data:`ROOT_CHUNK` matrices, split across
data-parallel ranks and all-gathered, with the eigh fallback where coupled Newton rejects a
matrix (:meth:`RootBatch._root`). What :class:`~.rootwork.RootWork` computes synchronously
and the root worker process (:mod:`.rootproc`) in the background, with the same numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mloc.runtime.optim.roots import Roots, inverse_root, resolve

ROOT_CHUNK = 16
"""Roots are computed in batches of at most this many matrices (``RootBatch._batched_root``)."""


class RootBatch:
    """See the module docstring. ``shard``: ``(rank, world)`` under data parallelism."""

    def __init__(self, epsilon: float, method: str):
        self.epsilon, self.method = epsilon, method
        self.shard: tuple[int, int] | None = None

    @torch.no_grad()
    def compute(self, stats, ps) -> dict:
        """New roots and their status (1 accepted, 0 rejected, -1 an all-zero statistic:
        nothing to precondition by yet) for every statistic, one batched root per
        (size, p) group."""
        groups: dict[tuple, list] = {}
        for i, ss in enumerate(stats):
            for j, s in enumerate(ss):
                groups.setdefault((s.shape[-1], ps[i]), []).append((i, j))
        roots = [list(ss) for ss in stats]
        status = [list(ss) for ss in stats]
        for (_, p), items in groups.items():
            parts = [stats[i][j].detach() for i, j in items]
            batch = parts[0] if len(parts) == 1 else torch.cat(parts)
            root, ok, all_ok = self._batched_root(batch, p)
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

    def _batched_root(self, batch: Tensor, p: int) -> tuple[Tensor, Tensor, bool]:
        """``(roots, ok, all_ok)`` of a batch of ``n`` matrices (``all_ok``: every root is
        known accepted without a host read, :attr:`.roots.Roots.all_ok`), computed in chunks of
        ``min(ROOT_CHUNK, n)`` (the last padded with identities): every root is computed in a
        batch of the same shape whatever the process layout (CPU batched matmuls round
        differently for different batch sizes). Under data parallelism rank ``r`` computes
        chunks ``r, r+W, …`` and the ranks all-gather them, so the roots equal one
        process's bit for bit."""
        n, size = batch.shape[0], batch.shape[-1]
        chunk = min(ROOT_CHUNK, n)
        count = -(-n // chunk)
        rank, world = self.shard or (0, 1)
        if count == 1 and world == 1:
            r = self._root(batch, p)
            return r.root, r.ok, r.all_ok
        eye = torch.eye(size, dtype=batch.dtype, device=batch.device)
        padded = torch.cat([batch, eye.expand(count * chunk - n, -1, -1)]).view(count, chunk, size, size)
        mine = [self._root(padded[c], p) for c in range(rank, count, world)]
        if world == 1:
            roots, oks = [r.root for r in mine], [r.ok for r in mine]
        else:
            roots, oks = self._gather([(r.root, r.ok) for r in mine], count, world, padded)
        return torch.cat(roots)[:n], torch.cat(oks)[:n], world == 1 and all(r.all_ok for r in mine)

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

    def _gather(self, mine, count, world, padded):
        """All-gather the ranks' chunks (each rank sends ``⌈count/W⌉``, identity-padded) and
        put them back in order."""
        import torch.distributed as dist
        per = -(-count // world)
        chunk = padded.shape[1]
        filler = (torch.zeros_like(padded[0]), torch.zeros(chunk, dtype=torch.bool, device=padded.device))
        mine = mine + [filler] * (per - len(mine))
        root_out = [torch.empty((per, *padded.shape[1:]), dtype=padded.dtype, device=padded.device)
                    for _ in range(world)]
        ok_out = [torch.empty(per, chunk, dtype=torch.uint8, device=padded.device) for _ in range(world)]
        dist.all_gather(root_out, torch.stack([r for r, _ in mine]).contiguous())
        dist.all_gather(ok_out, torch.stack([k for _, k in mine]).to(torch.uint8))
        order = [(c % world, c // world) for c in range(count)]
        return [root_out[r][i] for r, i in order], [ok_out[r][i].bool() for r, i in order]
