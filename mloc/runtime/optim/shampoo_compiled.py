r"""Shampoo (:mod:`.shampoo`) compiled: its commit with the part after the roots in a
compiled region (:func:`compiled_commit`), and its update inside a compiled step's graph
between root refreshes (:meth:`Shampoo.fused_update <.shampoo.Shampoo.fused_update>`, :func:`host_work`).

**In the step's graph** (:mod:`mloc.runtime.compiled.fused`). Between root refreshes
Shampoo's step is pure tensor work: with ``G`` the gradient (plus ``wd·θ``, coupled decay)
laid out in blocks, the statistics ``Sᵢ ← β₂Sᵢ + w·G₍ᵢ₎G₍ᵢ₎ᵀ``, the grafted direction
``D``, the preconditioned ``P = G ×₁ Q₁ ⋯ ×ₖ Qₖ`` with the roots ``Qᵢ`` in use, rescaled
to ``‖D‖``, momentum and the update. ``Shampoo.fused_update`` is exactly that (no root work):
the roots, statistics, grafting accumulators and momentum buffers are the graph's inputs
(tensors, never constants, so an install that replaces the roots changes no graph), the
statistics and accumulators are written in place; of the step count, ``adam`` grafting's
bias corrections ``1−β₁ᵗ, 1−β₂ᵗ`` are computed in the graph from the lifted count (float64),
and ``t > start_preconditioning_step`` is a guard (one graph before the start, one
after). A step that installs or refreshes roots (:func:`host_work`: a pending slot due at
``t``, or ``t`` a multiple of ``update_every`` with a preconditioned tensor) does host work
between the statistics and the update (eigendecompositions, rejection, background jobs),
so on that step alone the graph holds the gradient and the commit runs after it, the
compiled one below, as before.

**Async roots** stay apart (:func:`unfused`): a background job writes the pending slots'
roots while training runs; those tensors are in the state a capture reads and restores.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mloc.runtime.optim.ops import FOREACH, FUNCTIONAL
from mloc.shared.roots import shampoo_roots_due

APART = "steps that install or refresh Shampoo's roots (host work) commit after the graph, compiled apart"
ASYNC = ("async_roots: a background job writes the pending roots, which are part of the state a "
         "captured step reads; the update after the roots is compiled apart")


def unfused(opt) -> str | None:
    """Why ``opt``'s update never joins a step's graph (async roots), else None."""
    return ASYNC if opt.hyper.async_roots else None


def host_work(opt, state) -> bool:
    """Whether the step after ``state`` installs roots (a pending slot due at it) or
    refreshes them (:func:`~mloc.shared.roots.shampoo_roots_due`, with a preconditioned
    tensor): what :meth:`Shampoo._step`'s root work acts on."""
    t, h = state.count + 1, opt.hyper
    return (any(slot["step"] == t for slot in state.pending)
            or (shampoo_roots_due(t, h.update_every, h.staleness) is not None and any(state.stats)))


def compiled_commit(opt, step, direction):
    """:meth:`Shampoo.commit <.shampoo.Shampoo.commit>` with the part of the step after the
    roots compiled (:mod:`.compiled`): :meth:`~Shampoo._step` as ever, the statistics (one matrix product
    per mode, in place) and the root work (refreshes, installs, background jobs) eager, and
    :meth:`~Shampoo._direction` (``direction``; ``step`` is :meth:`~Shampoo._step`: the grafting, the preconditioning ``Q₁ G Q₂``, the
    rescaling, momentum, the update: the elementwise work, fused) in one region, one graph
    for every step: the roots, the gradients' blocks and a schedule's rate are inputs; of
    the step count only ``adam`` grafting's bias corrections enter, as host numbers in a
    tensor, and the start of preconditioning, as a 0-dim flag (before it both directions
    are computed, and the grafted one taken)."""
    from mloc.runtime.optim.compiled import CompiledCommit, Region, host_numbers

    def written(g, x, roots, accs, buffers, params, bias, precondition, lays):
        # the region: _direction as commit runs it (FOREACH with number hyperparameters;
        # FUNCTIONAL, then params += updates, with a tensor one)
        ops = FOREACH if opt.inplace else FUNCTIONAL
        bias = None if bias is None else tuple(bias.unbind())
        graft, momentum, updates = direction(ops, bias, precondition, g, x, roots, accs, buffers, params, lays)
        if updates is not None:
            for p, u in zip(params, updates):
                p.add_(u)
        return graft, momentum

    region = Region(written, "Shampoo_direction")

    def compiled(ops, bias, started, g, x, roots, accs, buffers, params, lays):
        numbers = None if bias is None else host_numbers(bias, params)
        graft, momentum = region(tuple(g), x, roots, accs, buffers, params, numbers, _flag(started, params), lays)
        return graft, momentum, None

    def commit(grads, state, params):
        ops = FOREACH if opt.inplace else FUNCTIONAL
        return step(ops, grads, state, list(params), compiled)[1]
    return CompiledCommit(commit, (region,))


_FLAGS: dict = {}


def _flag(value: bool, params) -> Tensor:
    """``value`` as a 0-dim bool tensor on the parameters' device (one of two kept per
    device, never written: an input of a compiled region, not a constant)."""
    device = params[0].device if params else torch.device("cpu")
    if device not in _FLAGS:
        _FLAGS[device] = (torch.tensor(False, device=device), torch.tensor(True, device=device))
    return _FLAGS[device][bool(value)]
