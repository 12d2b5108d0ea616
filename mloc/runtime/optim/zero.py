"""ZeRO stage 1 for mloc's functional optimizers (`strategy = zero`): each rank keeps and
updates the optimizer state of its shard of the parameters only.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020, §5.1 (P_os). With ``N`` ranks and ``S`` bytes of optimizer state, a rank
holds about ``S/N``; parameters and gradients stay replicated.

- **Partition**: whole tensors (:func:`mloc.runtime.optim.shards.owners`), balanced by the
  bytes of their state as the wrapped optimizer lays it out (measured by ``init`` on the
  meta device: Shampoo's statistics grow as a block's side squared, Adam's as the tensor).
  Whole tensors, not flat-buffer slices, because every optimizer here works per tensor or
  per block of a tensor (Shampoo's Kronecker factors): a slice would cut a block.
- **Gradients**: all-reduced as under ``ddp`` (bucketed, during the backward:
  :mod:`mloc.runtime.base.overlap`) and each rank reads its shard's (stage 1). A
  reduce-scatter (stage 2) would save the gradient memory only if the backward did not
  materialise every gradient, which ``autograd.grad`` does.
- **Commit**: the wrapped optimizer's own commit on the owned parameters (bitwise what it
  computes for them unsharded: every optimizer here is per tensor), then each rank's
  updated parameters are broadcast from it, one collective per rank and dtype.
- **Shampoo**: a rank holds the statistics and roots of its own tensors' blocks only and
  computes only their roots; that replaces the data-parallel root split (every rank a
  slice of every batch, then an all-gather), which needs every rank to hold every
  statistic.
- **What reads the whole state**: an unrolled step (``itd``: :meth:`Zero.update`) gathers
  it, once per hypergradient step; SAMA's diagonal (:meth:`Zero.diag`) is computed by each
  owner for its tensors and broadcast like the parameters; a vectorized meta-batch solves
  with the wrapped optimizer itself and hands back a whole state, which the next commit
  cuts to the shard (:meth:`Zero.local`).
- **Checkpoints** hold the whole state as a replicated run writes it (:meth:`Zero.gathered`,
  :meth:`Zero.select`), so they resume into any world size and either strategy; or, with
  `checkpoint_form = sharded`, each rank's shard in a file of its own beside a manifest
  (:mod:`mloc.runtime.program.sharded`), which resumes into any of them too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from mloc.runtime.base import tree
from mloc.runtime.base.tree import Params, absent, marked
from mloc.runtime.optim import shards
from mloc.runtime.optim.base import Optimizer, commit_present


class ZeroState(NamedTuple):
    shard: dict     # {"state": the wrapped optimizer's state of the owned parameters}; a
                    # dict, so that nothing takes it for a per-parameter field


class Zero(Optimizer):
    """``inner`` sharded over ``world`` ranks (this one ``rank``); see the module docstring."""

    def __init__(self, inner: Optimizer, rank: int, world: int):
        self.inner, self.rank, self.world = inner, rank, world
        self._owners: tuple[int, ...] | None = None

    # --- what the engine reads of an optimizer: the wrapped one's ---------------------------
    hyper = property(lambda self: self.inner.hyper, lambda self, h: setattr(self.inner, "hyper", h))
    inplace = property(lambda self: self.inner.inplace)
    diag_uses_grad = property(lambda self: self.inner.diag_uses_grad)
    has_diag = property(lambda self: self.inner.has_diag)

    def schedule_stand_in(self, lr):
        return self.inner.schedule_stand_in(lr)

    def drives(self, key):
        return self.inner.drives(key)

    def scheduled_rate(self, dtype, device):
        return self.inner.scheduled_rate(dtype, device)

    def drive(self, keys, like):
        return self.inner.drive(keys, like)

    def start(self) -> None:
        self.inner.start()
        own = getattr(self.inner, "own_roots", None)
        if own is not None:
            own()

    def drain(self) -> None:
        self.inner.drain()

    def close(self) -> None:
        self.inner.close()

    # --- the shard ----------------------------------------------------------------------------
    def owners(self, params: Params) -> tuple[int, ...]:
        """The rank of each parameter (computed once, from the shapes)."""
        if self._owners is None or len(self._owners) != len(params):
            weights = [_state_bytes(self.inner, p) for p in params]
            if not any(weights):                # no state at all (SGD without momentum): by size
                weights = [p.numel() * p.element_size() for p in params]
            self._owners = shards.owners(weights, self.world)
        return self._owners

    def owned(self, params: Params) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.owners(params)) if r == self.rank)

    def local(self, state: Any, params: Params) -> Any:
        """The wrapped optimizer's state of the owned parameters: ``state``'s own, or cut
        from a whole state (one a meta-batch's solve handed back)."""
        if isinstance(state, ZeroState):
            return state.shard["state"]
        plain = shards.select(tree.to_plain(state), self.owned(params))
        return _rebuilt(plain, type(state))

    def init(self, params):
        index = self.owned(params)
        return ZeroState({"state": self.inner.init(tuple(params[i] for i in index))})

    # --- stepping -------------------------------------------------------------------------------
    def commit(self, grads, state, params):
        return self._commit(self.inner.commit, grads, state, params)

    def _commit(self, step, grads, state, params):
        index = self.owned(params)
        local = self.local(state, params)
        if index:
            missing = set(absent(grads))
            mine = marked([grads[i] for i in index], [j for j, i in enumerate(index) if i in missing])
            local = commit_present(self.inner, mine, local, tuple(params[i] for i in index), absent(mine), step)
        self._broadcast(params)
        return ZeroState({"state": local})

    def compiled_commit(self):
        """The wrapped optimizer's compiled commit on the shard; the broadcast eager."""
        from mloc.runtime.optim.compiled import CompiledCommit
        inner = self.inner.compiled_commit()
        return CompiledCommit(lambda g, s, p: self._commit(inner, g, s, p), inner.regions, inner.refused)

    def update(self, grads, state, params):
        """The wrapped optimizer's functional step from the whole state (gathered from the
        ranks when ``state`` is a shard's: an unrolled step's start)."""
        if isinstance(state, ZeroState):
            state = self.whole(state, params)
        return self.inner.update(grads, state, params)

    def diag(self, grads, state, params):
        """SAMA's diagonal: each owner's for its tensors (as tensors), broadcast."""
        index = self.owned(params)
        mine = tuple(params[i] for i in index)
        own = self.inner.diag(None if grads is None else tuple(grads[i] for i in index),
                              self.local(state, params), mine) if index else ()
        out = [torch.empty_like(p) for p in params]
        with torch.no_grad():
            for i, d, p in zip(index, own, mine):
                out[i].copy_(torch.as_tensor(d, dtype=p.dtype, device=p.device).expand_as(p))
        self._broadcast(out, params)
        return tuple(out)

    def committed(self, state):
        return self.inner.committed(state.shard["state"] if isinstance(state, ZeroState) else state)

    def report(self, state):
        return self.inner.report(state.shard["state"] if isinstance(state, ZeroState) else state)

    @torch.no_grad()
    def _broadcast(self, tensors: Params, params: Params | None = None) -> None:
        """Each rank's tensors (its owned parameters' entries) to every rank, one broadcast
        per rank and dtype, in place."""
        owners = self.owners(params if params is not None else tensors)
        for r in range(self.world if self.world > 1 else 0):      # one rank: nothing to send
            group = [t for t, o in zip(tensors, owners) if o == r]
            for same in _by_dtype(group):
                flat = torch.cat([t.reshape(-1) for t in same])
                dist.broadcast(flat, src=r)
                if r != self.rank:
                    _unflatten(flat, same)

    # --- the whole state (checkpoints, unrolled steps) ---------------------------------------------
    def gathered(self, state: Any, params: Params) -> dict:
        """The whole state as a plain tree (:func:`~mloc.runtime.base.tree.to_plain`), what a
        replicated run's checkpoint holds: every rank's shard, gathered (every rank calls)."""
        mine = (self.owned(params), tree.to_plain(tree.map_tensors(self.local(state, params), lambda t: t.cpu())))
        parts: list = [mine] * self.world
        if self.world > 1:
            dist.all_gather_object(parts, mine)
        return shards.join(parts, len(params))

    def whole(self, state: Any, params: Params) -> Any:
        """The wrapped optimizer's state of every parameter (gathered), on their device."""
        plain = self.gathered(state, params)
        device = params[0].device if params else torch.device("cpu")
        return _rebuilt(tree.map_tensors(plain, lambda t: t.to(device)), type(self.local(state, params)))

    def select(self, plain: dict, params: Params) -> dict:
        """A whole plain state (a checkpoint's) cut to this rank's shard: the plain tree of
        the wrapped optimizer's state of the owned parameters."""
        return shards.select(plain, self.owned(params))


def _state_bytes(opt: Optimizer, p: torch.Tensor) -> int:
    """The bytes of ``opt``'s state for ``p`` alone, laid out on the meta device."""
    state = opt.init((torch.empty(p.shape, dtype=p.dtype, device="meta"),))
    return sum(t.numel() * t.element_size() for t in tree.tensors(state))


def _rebuilt(plain: dict, cls: type) -> Any:
    """A state of NamedTuple class ``cls`` from its plain tree (lists back to tuples)."""
    return cls(**{f: _tuples(plain[f]) for f in cls._fields})


def _tuples(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    if isinstance(x, dict):
        return {k: _tuples(v) for k, v in x.items()}
    return x


def _by_dtype(tensors: list) -> list[list]:
    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _unflatten(flat: torch.Tensor, tensors: list) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
