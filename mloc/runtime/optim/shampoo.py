r"""Shampoo: Kronecker-factored preconditioning with grafting, blocking, stale and
asynchronous roots (Gupta, Koren & Singer, "Shampoo: Preconditioned Stochastic Tensor
Optimization", ICML 2018; Anil, Gupta, Koren, Regan & Singer, "Scalable Second Order
Optimization for Deep Learning", 2020).

Per parameter, at step ``t`` (1-based) with gradient ``g`` (plus ``wd·θ`` for coupled
weight decay), laid out in equal-shaped blocks (:mod:`.blocks`: merged small dims, blocks
of ``block_size``, 1-D tensors and tensors with a dim above ``max_precond_dim`` updated by
the grafted direction alone):

.. math::
    S_i \leftarrow \beta_2 S_i + w\, G_{(i)} G_{(i)}^\top \quad (w = 1 \text{ if } \beta_2 = 1
    \text{, a running sum; } 1-\beta_2 \text{ otherwise})

    P = G \times_1 Q_1 \cdots \times_k Q_k,\qquad Q_i \approx (S_i + \varepsilon\lambda_{\max}(S_i) I)^{-1/p}

with ``p = 2k`` (exponent ``−1/(2k)``; ``exponent_override`` sets ``p``). The roots ``Qᵢ``
are refreshed every ``update_every`` steps by :func:`.roots.inverse_root` (float64; an
eigendecomposition on the CPU, coupled Newton on an accelerator: ``root_method="auto"``),
batched over all blocks of equal size, from statistics that are
never modified by the ridge; a rejected root (non-finite or inaccurate) keeps the
previous one and counts a consecutive failure per matrix (``state.failures``; a warning
says so). Roots start as identities.

**Staleness** ``s``: roots computed from the statistics of step ``t`` are installed at step
``t+s`` (used from that step's update on). With ``async_roots`` they are computed in a
worker process (statistics on the CPU; a thread on an accelerator, :mod:`.rootjobs`)
while training continues; installing waits for the job if it has not
finished, so the asynchronous run equals the ``staleness = s`` run bit for bit (it only
saves wall time when the job finishes within ``s`` steps). ``drain()`` waits for every job
(a checkpoint then holds their results), ``close()`` stops the worker.

**Grafting** (per tensor): a diagonal optimizer's direction ``D`` (``sgd``: ``g``;
``adagrad``: ``g/(√Σg²+δ)``; ``rmsprop``: ``g/(√v+δ)``, ``v`` an EMA with ``graft_beta2``;
``adam``: bias-corrected ``m̂/(√v̂+δ)``, ``β₁ = 0.9``; ``δ = 1e-10``; ``none``: ``g`` and no
rescaling). Until step ``start_preconditioning_step`` (inclusive) the direction is ``D``;
after it, ``P·‖D‖/(‖P‖+1e-16)``. Then momentum ``b ← μb + d`` (Nesterov: ``d + μb``) and
``Δθ = −η·(b or d+μb) − η·wd·θ`` (the last term for decoupled weight decay).

**Differentiation** (``itd``): :meth:`Shampoo.update` is out of place and differentiable
with respect to the gradients, the parameters and a tensor learning rate, with the roots
(and the statistics they come from) treated as constants between refreshes: the graph
runs through ``Q₁ G Q₂``, the grafting norms and accumulators, and momentum.

**Compiled** (:mod:`.shampoo_compiled`): the commit with the part of the step after the
roots under ``torch.compile``, the statistics and every root job eager around it; the same
state. In a compiled step's graph, the whole update on the steps between root refreshes
(roots and statistics as the graph's inputs), and the compiled commit after the graph on
the steps that install or refresh roots.

**SAMA** (:meth:`Shampoo.diag`): per block ``η·c·σ·(diag Q₁ ⊗ … ⊗ diag Q_k)``, ``c`` the
momentum factor (``1``, or ``1+μ`` for Nesterov), ``σ = ‖D‖/‖P‖`` the grafting scale (1 for
``none``). With the roots held constant this is the exact diagonal of ``−∂Δθ/∂g`` for
``graft="none"`` (the diagonal of a Kronecker product is the product of diagonals); with
grafting it ignores ``σ``'s dependence on ``g``. On diagonal-policy tensors and before the
start it is the grafted optimizer's diagonal with its accumulator held constant (exact for
``sgd``/``none``).

**Data parallelism**: with a process group of several ranks (the gradients are
all-reduced, so every rank holds the same statistics), each rank computes its chunks of
every batch of roots and the ranks exchange them, one all-gather per refresh; with
``async_roots`` each rank's worker computes its share and the exchange happens when the
roots are due (:mod:`.rootwork`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from mloc.shared.hyper import GRAFTS, ShampooHyper
from mloc.runtime.optim import blocks, graft as grafting, shampoo_compiled as compiled
from mloc.runtime.optim.base import Optimizer, is_zero, numbers, takes
from mloc.runtime.optim.ops import FOREACH, FUNCTIONAL
from mloc.runtime.optim.rootwork import RootWork, clone_tuple, failure_counts, merge_due



class ShampooState(NamedTuple):
    count: int             # steps taken
    stats: tuple           # per parameter: a tuple of (B, b_i, b_i) statistics per mode; ()
    roots: tuple           # per parameter: the roots in use, as stats
    failures: tuple        # per parameter: per mode, (B,) int64 consecutive rejected roots
    graft: tuple           # per parameter: the grafting accumulators (() for sgd/none)
    momentum: tuple        # per parameter: the momentum buffer; () without momentum
    pending: tuple         # per staleness slot: {"step": due step or -1, "roots", "status"}
                           # (mloc.runtime.optim.rootwork)


class Shampoo(Optimizer):
    """See the module docstring. A scheduler may drive ``momentum`` (OneCycleLR's momentum
    cycling: Shampoo has no ``betas``) and ``weight_decay`` (:class:`ShampooHyper`)."""

    apart = compiled.APART

    @property
    def unfused(self) -> str | None:
        """Async roots keep the update out of a step's graph (:func:`.shampoo_compiled.unfused`)."""
        return compiled.unfused(self)

    def __init__(self, hyper: ShampooHyper):
        super().__init__(hyper)
        h = hyper
        if h.graft not in GRAFTS:
            raise ValueError(f"unknown graft {h.graft!r}; expected one of {GRAFTS}")
        self.inplace = numbers(h.lr, h.beta2, h.momentum, h.weight_decay, h.graft_beta2)
        self.work = RootWork(h.epsilon, h.root_method, h.update_every, h.staleness)
        self.slots = self.work.slots
        self._layouts: dict[tuple, blocks.Layout] = {}
        self._layout_lists: dict[tuple, tuple] = {}

    # --- layout and state ---------------------------------------------------------------
    def layout(self, p: Tensor) -> blocks.Layout:
        key = tuple(p.shape)
        if key not in self._layouts:
            h = self.hyper
            self._layouts[key] = blocks.layout(key, h.block_size, h.max_precond_dim, h.exponent_override)
        return self._layouts[key]

    def layouts(self, params) -> tuple:
        """Every parameter's :meth:`layout`, looked up once per list of shapes."""
        key = tuple(p.shape for p in params)
        if key not in self._layout_lists:
            self._layout_lists[key] = tuple(self.layout(p) for p in params)
        return self._layout_lists[key]

    def init(self, params):
        stats, roots, fails = [], [], []
        for p in params:
            lay = self.layout(p)
            sizes = lay.block if lay.policy == "shampoo" else ()
            stats.append(tuple(p.new_zeros(lay.count, b, b) for b in sizes))
            roots.append(tuple(torch.eye(b, dtype=p.dtype, device=p.device).repeat(lay.count, 1, 1)
                               for b in sizes))
            fails.append(tuple(torch.zeros(lay.count, dtype=torch.int64, device=p.device) for _ in sizes))
        n_graft = grafting.ACCUMULATORS[self.hyper.graft]
        graft = tuple(tuple(torch.zeros_like(p) for _ in range(n_graft)) for p in params)
        mom = tuple(torch.zeros_like(p) for p in params) if not is_zero(self.hyper.momentum) else ()
        pending = tuple({"step": -1, "roots": tuple(map(clone_tuple, roots)),
                         "status": tuple(tuple(f.to(torch.int8) for f in fs) for fs in fails)}
                        for _ in range(self.slots))
        return ShampooState(0, tuple(stats), tuple(roots), tuple(fails), graft, mom, pending)

    # --- the step -----------------------------------------------------------------------
    def update(self, grads, state, params):
        return self._step(FUNCTIONAL, grads, state, params)

    def commit(self, grads, state, params):
        """:meth:`update`'s step in place (:meth:`_step` under :data:`~.ops.FOREACH`): the
        statistics, grafting accumulators, momentum buffers and parameters are overwritten,
        the elementwise work one ``torch._foreach_*`` call per operation over all tensors.
        With a tensor hyperparameter (a schedule's learning rate) it is :meth:`update`
        followed by ``params += updates``."""
        if not self.inplace:
            return super().commit(grads, state, params)
        return self._step(FOREACH, grads, state, list(params))[1]

    def _step(self, ops, grads, state, params, direction=None):
        """One step (the module docstring) in the algebra of :mod:`.ops`: ``(updates,
        state)`` under :data:`~.ops.FUNCTIONAL`; under :data:`~.ops.FOREACH` the state and
        the parameters are written. The blocks of ``g`` are laid out once, detached (the
        roots are constants to autograd), for the statistics (one kernel in either form,
        :func:`.blocks.accumulate`) and, where ``g`` carries no graph, the preconditioner.
        ``direction``: what computes the step after the roots (default :meth:`_direction`;
        :meth:`compiled_commit`'s compiled region)."""
        h, t = self.hyper, state.count + 1
        lays = self.layouts(params)
        g, x, stats = self._accumulate(ops, grads, state.stats, params, lays)
        roots, failures, pending = self._roots(t, stats, state, lays)
        graft, momentum, updates = (direction or self._direction)(
            ops, self._bias(t), t > h.start_preconditioning_step, g, x, roots, state.graft, state.momentum,
            params, lays)
        return updates, ShampooState(t, stats, roots, failures, graft, momentum, pending)

    def _accumulate(self, ops, grads, stats, params, lays):
        """``(g, x, stats)``: the gradients with coupled weight decay, their blocks
        (detached; None for a diagonal-policy tensor) and the statistics after them, the
        first part of :meth:`_step`."""
        h = self.hyper
        g = self._decayed(grads, params)
        x = [blocks.to_blocks(gi.detach(), lay) if s else None for gi, s, lay in zip(g, stats, lays)]
        stats = tuple(blocks.accumulate(s, xi, h.beta2, inplace=ops.inplace) if s else ()
                      for xi, s in zip(x, stats))
        return g, x, stats

    def _direction(self, ops, bias, precondition, g, x, roots, accs, buffers, params, lays):
        """``(graft accumulators, momentum buffers, updates)``, the part of :meth:`_step`
        after the roots: the grafted directions (``bias``: the step's numbers,
        :meth:`_bias`), preconditioned where ``precondition`` (a bool, or a 0-dim bool
        tensor that selects per element: the compiled step's one graph before and after
        ``start_preconditioning_step``), momentum, the update."""
        h = self.hyper
        graft, d = grafting.directions(ops, h.graft, h.graft_beta2, None, g, accs, bias)
        if isinstance(precondition, Tensor) or precondition:
            d = _preconditioned(ops, d, g, x, roots, lays, h.graft, precondition)
        momentum, updates = _momentum(ops, h, d, buffers, params)
        return graft, momentum, updates

    def _bias(self, t):
        """All that the step reads of the step count ``t`` besides the root schedule and the
        start of preconditioning: the grafting's bias corrections
        (:func:`.graft.corrections`; None but for ``adam``), host numbers."""
        return grafting.corrections(self.hyper.graft, self.hyper.graft_beta2, t)

    def compiled_commit(self):
        """:meth:`commit` with the part of the step after the roots compiled
        (:func:`.shampoo_compiled.compiled_commit`)."""
        return compiled.compiled_commit(self, self._step, self._direction)

    def host_work(self, state) -> bool:
        """Whether the next step installs or refreshes roots (:func:`.shampoo_compiled.host_work`)."""
        return compiled.host_work(self, state)

    def fused_update(self, grads, state, params):
        """``(updates, state)``: :meth:`update` on a step without root work (the roots,
        failures and pending slots passed through), what a step's graph holds
        (:mod:`.shampoo_compiled`; the step count a lifted number there)."""
        t = state.count + 1
        lays = self.layouts(params)
        g, x, stats = self._accumulate(FUNCTIONAL, grads, state.stats, params, lays)
        graft, momentum, updates = self._direction(FUNCTIONAL, self._bias(t), t > self.hyper.start_preconditioning_step,
                                                   g, x, state.roots, state.graft, state.momentum, params, lays)
        return updates, state._replace(count=t, stats=stats, graft=graft, momentum=momentum)

    def _decayed(self, grads, params):
        h = self.hyper
        if h.decoupled_weight_decay or is_zero(h.weight_decay):
            return tuple(grads)
        return tuple(g + h.weight_decay * p for g, p in zip(grads, params))

    def _roots(self, t, stats, state, lays):
        """``(roots, failures, pending)`` for step ``t``: the slots due installed, this step's
        refresh started (or computed), and with staleness 0 its roots installed at once."""
        roots, failures, pending = self.work.install(t, state.roots, state.failures, state.pending)
        pending = self.work.refresh(t, stats, _orders(lays), pending, background=self.hyper.async_roots)
        if not self.slots:          # staleness 0: this step's roots are used by this step
            roots, failures, pending = self.work.install(t, roots, failures, pending)
        return roots, failures, pending

    def _precondition(self, g, lay, roots) -> Tensor:
        """``G ×₁ Q₁ ⋯ ×ₖ Qₖ`` blockwise, ``g`` laid out by ``lay``, in its shape."""
        return blocks.from_blocks(blocks.precondition(blocks.to_blocks(g, lay), roots), lay)

    def _statistics(self, g, stats, lays):
        """The statistics after ``g`` laid out by ``lays``, new tensors (detached where ``g``
        needs grad: the roots are constants to autograd), as :meth:`_step` computes them:
        what SAMA's diagonal refreshes the roots from with staleness 0."""
        return tuple(blocks.accumulate(s, blocks.to_blocks(gi.detach() if gi.requires_grad else gi, lay),
                                       self.hyper.beta2)
                     if s else () for gi, s, lay in zip(g, stats, lays))

    def committed(self, state):
        """The statistics, the roots in use, the grafting accumulators and the momentum; not
        the pending slots, whose roots a background job may still be writing (an accepted
        root is finite by construction, :mod:`.roots`; it is checked here once installed,
        and the whole state before every checkpoint)."""
        out = [t for group in (state.stats, state.roots, state.graft) for ts in group for t in ts]
        out.extend(state.momentum)
        return tuple(out)

    def report(self, state) -> dict[str, float]:
        """``roots_rejected``: matrices whose last root refresh was rejected (the previous
        root is in use); ``root_failures``: the most consecutive rejections of one matrix.
        Both 0 in a healthy run; nothing without a preconditioned tensor."""
        counts = failure_counts(state.failures)
        return {} if counts is None else dict(zip(("roots_rejected", "root_failures"), counts))

    # --- lifecycle (the root work's background worker) ---------------------------------
    def start(self) -> None:
        """Start the root worker (``async_roots``); under a process group of several ranks
        split the root work (synchronous or asynchronous, :mod:`.rootwork`)."""
        self.work.start(self.hyper.async_roots)

    def own_roots(self) -> None:
        """Under `strategy = zero` (:mod:`.zero`): this rank computes all the roots of its own
        tensors' statistics itself (no split, no exchange; in the background with ``async_roots``)."""
        self.work.own_roots()

    def drain(self) -> None:
        """Wait for every root job: the state's pending slots are then complete."""
        self.work.drain()

    def close(self) -> None:
        self.work.close()

    # --- SAMA -------------------------------------------------------------------------------
    def diag(self, grads, state, params):
        """SAMA's diagonal of ∂update/∂grad (:func:`_sama_diagonal`)."""
        return _sama_diagonal(self, grads, state, params)


@torch.no_grad()
def _sama_diagonal(opt: Shampoo, grads, state, params):
    """SAMA's diagonal of ∂update/∂grad (see the module docstring): ``η·c·σ·(diag Q₁ ⊗ …)``
    with the roots the next update would use (computed synchronously, no job started), or
    the graft's diagonal. Host work (a drain, the roots due, a refresh), so a step that
    reads it cannot be captured into a graph: it runs eagerly, and says why."""
    if get_proxy_mode() is not None:
        raise RuntimeError("SAMA's diagonal of Shampoo does root work on the host (waits for the "
                           "background root jobs, installs the roots due at the step), which a graph cannot replay")
    opt.drain()                     # the slots due at the next step are complete
    t = state.count + 1
    g = opt._decayed(grads, params)
    pending = state.pending
    if not opt.slots:               # staleness 0: the next step computes its own roots
        lays = opt.layouts(params)
        stats = opt._statistics(g, state.stats, lays)
        pending = opt.work.refresh(t, stats, _orders(lays), pending, background=False)
    roots, _, _ = merge_due(t, state.roots, state.failures, pending)
    h = opt.hyper
    c = (1 + h.momentum if h.nesterov else 1.0) if not is_zero(h.momentum) else 1.0
    out = []
    for gi, acc, rts, p in zip(g, state.graft, roots, params):
        acc, d = grafting.direction(h.graft, h.graft_beta2, t, gi, acc)
        if rts and t > h.start_preconditioning_step:
            kd = blocks.from_blocks(blocks.kron_diagonal(list(rts)), opt.layout(p))
            if h.graft != "none":
                kd = kd * (_norm(d) / (_norm(opt._precondition(gi, opt.layout(p), rts)) + 1e-16))
            out.append(h.lr * c * kd)
        else:
            out.append(h.lr * c * grafting.diagonal(h.graft, h.graft_beta2, t, acc))
    return tuple(out)


def _orders(lays) -> tuple:
    """Each parameter's root order ``p`` (0 for the diagonal policy)."""
    return tuple(lay.p for lay in lays)


def _preconditioned(ops, d, g, x, roots, lays, graft, when=True) -> list:
    """The directions ``d`` with every preconditioned tensor's replaced by its gradient
    ``g`` preconditioned, ``P = G ×₁ Q₁ ⋯ ×ₖ Qₖ``, and (unless ``graft`` is ``none``)
    rescaled to the grafted norm, ``P·‖D‖/(‖P‖+10⁻¹⁶)``. ``x``: ``g``'s blocks, detached
    (the statistics'), used as they are unless ``g`` carries a graph (then laid out
    again, here: the derivative runs through ``P``). ``when``: True, or a 0-dim bool
    tensor choosing between ``P`` and ``d`` (``torch.where``: either exactly)."""
    idx = [i for i, r in enumerate(roots) if r]
    x = [blocks.to_blocks(g[i], lays[i]) if g[i].requires_grad else x[i] for i in idx]
    pre = [blocks.from_blocks(blocks.precondition(xi, roots[i]), lays[i]) for xi, i in zip(x, idx)]
    if graft != "none":
        pre = ops.rescale_(pre, [d[i] for i in idx], 1e-16)
    d = list(d)
    for i, p in zip(idx, pre):
        d[i] = p if when is True else torch.where(when, p, d[i])
    return d


def _momentum(ops, h: ShampooHyper, d, buffers, params) -> tuple:
    """``(momentum buffers, updates)`` of the last stage: ``b' = μb + d`` (new tensors:
    ``d`` may be the caller's gradient), ``θ ← θ − η·b'`` (heavy ball) or
    ``θ ← θ − η·(d + μb')`` (Nesterov), with ``θ·(1 − η·wd)`` first for decoupled weight
    decay; without momentum ``θ ← θ − η·d``."""
    lr, mu = h.lr, h.momentum
    decay = (lr, h.weight_decay) if h.decoupled_weight_decay and not is_zero(h.weight_decay) else None
    if is_zero(mu):
        return (), ops.step(params, d, lr, decay)
    new = ops.add(d, buffers, mu)
    if h.nesterov:
        return tuple(new), ops.step_nesterov(params, d, buffers, new, mu, lr, decay)
    return tuple(new), ops.step(params, new, lr, decay)


def _norm(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x)


@takes(ShampooHyper)
def shampoo(hyper: ShampooHyper) -> Shampoo:
    """Shampoo (see :class:`Shampoo` and the module docstring)."""
    return Shampoo(hyper)
