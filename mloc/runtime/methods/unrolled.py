r"""Iterative differentiation (ITD): differentiate through ``K`` optimizer steps.

``θ_{k+1} = θ_k + u(∇_θ L(θ_k, x), s_k, θ_k)`` with the lower problem's own functional
optimizer (``optim``), started at its current parameters and state. Write one step as
``Φ: (θ_k, s_k, x) ↦ (θ_{k+1}, s_{k+1})``. The uppers then see ``θ_K``; the BR-VJP is
``(dθ_K/dx)ᵀ v``, exact for the unrolled program whatever ``K`` (Maclaurin et al.,
"Gradient-based Hyperparameter Optimization through Reversible Learning", ICML 2015;
Franceschi et al., "Forward and Reverse Gradient-Based Hyperparameter Optimization",
ICML 2017). The unroll is a look-ahead: it does not commit the lower's parameters or
state; the training loop steps the lower itself.

The three modes give the same number at different costs: recompute does reverse mode's
arithmetic (bitwise its result), forward mode the same products in another order (equal
to rounding). ``T = truncate or K`` steps are differentiated; the first ``K − T`` run without graph
(truncated back-propagation; Shaban et al., "Truncated Back-propagation for Bilevel
Optimization", AISTATS 2019). ``d``: the lower's parameters (with its optimizer state),
``x``: the parameters of the uppers its loss reads and the optimizer's hyperparameters that
are autograd leaves (an upper's learnable step size), ``m`` numbers; ``G``: one forward and
backward of the lower's loss.

- ``reverse``: keep the graphs of the ``T`` steps, one reverse sweep
  ``a_k = (∂Φ/∂(θ, s))ᵀ a_{k+1}``, ``g_x += (∂Φ/∂x)ᵀ a_{k+1}``. Memory ``T`` step graphs;
  time about ``4 G`` per step.
- ``recompute``: the same sweep over √T checkpoints (Griewank, "Achieving logarithmic
  growth of temporal and spatial complexity in reverse automatic differentiation", 1992;
  Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016). With segments of
  ``c = ⌈√T⌉`` steps, the unroll keeps only the iterates ``(θ_k, s_k)`` at ``k = 0, c,
  2c, …``; the sweep takes the segments last to first, recomputes a segment's ``c``
  iterates from its checkpoint (no graph), then rebuilds and sweeps its steps one graph
  at a time. Memory: ``⌈T/c⌉ + c ≤ 2⌈√T⌉`` iterates and one step's graph, instead of
  ``T`` graphs. Time: reverse's graph steps and sweep, plus the unroll without graph
  (``T`` steps) and the segments' recomputation (``T − ⌈T/c⌉`` steps): about two graph-free
  unrolls more than reverse mode, one more than keeping every iterate would take. Binomial
  checkpointing (Griewank & Walther, "Algorithm 799: revolve", ACM TOMS 2000) would keep
  ``O(log T)`` iterates for ``O(T log T)`` recomputed steps; √T is simpler and its one
  extra unroll is cheap next to the sweep.
- ``forward``: carry the tangents ``Z_k = dθ_k/dx`` and ``S_k = ds_k/dx`` (``m`` columns each),
  ``(Z, S)_{k+1} = ∂Φ/∂(θ, s) · (Z, S)_k + ∂Φ/∂x``, ``(Z, S)_0 = 0``, and return
  ``(dθ_K/dx)ᵀ v = Z_Kᵀ v``. Column ``j`` is the Jacobian-vector product of ``Φ`` in the
  direction ``t_j = (Z_j, S_j, e_j)``. It is formed from reverse-mode primitives (the
  "double-backward" JVP; Townsend, "A new trick for calculating Jacobian vector
  products", 2017): for a dummy cotangent ``u``, ``w(u) = Jᵀu`` is linear in ``u``, so
  ``J t = ∂⟨w(u), t⟩/∂u``, one backward through ``w``'s graph, batched over
  :data:`DIRECTIONS_PER_BATCH` directions at a time (``autograd.grad(...,
  is_grads_batched=True)``, a vmap over the backward). Per step: ``Φ`` with its graph
  (about ``2 G``), ``w`` with its graph (``2 G``, reverse mode's sweep step) and one batched
  backward per ``DIRECTIONS_PER_BATCH`` directions (``2 G`` per direction of arithmetic,
  in one pass over the graph). Memory: ``(Z, S)``, ``m·d`` numbers, and one step's graphs
  with one batch's intermediates, flat in ``K``; worth it when ``m`` is small and ``K``
  large. Only reverse-mode autograd runs, so any loss reverse mode differentiates (in-place
  ops, data-dependent control flow) works, with one more derivative order of its ops. A
  batch the vmap cannot take (an op whose third-order code reads values on the host)
  warns and runs one direction at a time: ``m`` backwards per step instead of one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from mloc.runtime.base import tree
from mloc.runtime.base.precision import autocast_off
from mloc.runtime.optim import apply_updates, keep_absent
from mloc.shared.unroll import DIRECTIONS_PER_BATCH, segment_length
from mloc.shared.warning import MlocWarning

_MODES = ("reverse", "forward", "recompute")


def _step(op, theta, state, create_graph, others=None):
    """One unrolled step. A parameter the loss does not reach stays where it is, with its
    optimizer state, as in the committed step (``optim.commit_present``)."""
    loss = op.loss_at(theta, others)
    with autocast_off():      # autocast wraps the forwards only
        g = tree.dense(torch.autograd.grad(loss, theta, create_graph=create_graph, allow_unused=True), theta)
    updates, new = op.problem.optimizer.update(g, state, theta)
    missing = tree.absent(g)
    if not missing:
        return apply_updates(theta, updates), new
    theta = tuple(t if i in missing else t + u for i, (t, u) in enumerate(zip(theta, updates)))
    return theta, keep_absent(new, state, missing, len(theta))


def _detached(theta, state):
    st = tree.detach(tree.tensors(state))
    return tree.detach(theta, True), tree.replace_tensors(state, st)


def _leaves(theta, state):
    """``(θ, s)`` as fresh autograd leaves, and the state's tensors."""
    st = tree.detach(tree.tensors(state), True)
    return tree.detach(theta, True), tree.replace_tensors(state, st), st


def _uppers(op):
    """Indices and values of the loss arguments other than the lower's own parameters."""
    idx = tuple(i for i in range(len(op.args)) if i != op.problem.index)
    return idx, tuple(op.args[i] for i in idx)


@dataclass(frozen=True)
class itd:
    """Unrolled differentiation through ``steps`` optimizer steps (see module docstring)."""

    steps: int
    truncate: int | None = None
    mode: str = "reverse"

    def __post_init__(self):
        if self.mode not in _MODES:
            raise ValueError(f"itd mode must be one of {_MODES}, not {self.mode!r}")
        if self.truncate is not None and not 0 < self.truncate <= self.steps:
            raise ValueError("itd truncate must be in 1..steps")

    @property
    def kept(self) -> int:
        return self.steps if self.truncate is None else self.truncate

    def _prefix(self, op):
        """The truncated prefix: the first ``steps - kept`` steps, without graph."""
        theta, state = op.theta, op.problem.state
        for _ in range(self.steps - self.kept):
            theta, state = _detached(*_step(op, theta, state, False))
        return theta, state

    def unroll(self, op):
        """Reverse mode: ``θ_K`` with the graph of the last ``kept`` steps."""
        theta, state = self._prefix(op)
        for _ in range(self.kept):
            theta, state = _step(op, theta, state, True)
        return theta

    def prepare(self, op):
        if self.mode == "reverse":
            op.memo = self.unroll(op)
            return tree.detach(op.memo, True)
        theta, state = self._prefix(op)
        if self.mode == "recompute":
            theta, op.memo = _checkpointed(op, theta, state, self.kept)
        else:
            theta, op.memo = _forward(op, theta, state, self.kept)
        return tree.detach(theta, True)

    def vjp(self, op, v, create_graph=False):
        if self.mode == "reverse":
            return op.memo, v
        if create_graph:
            raise NotImplementedError(f"itd(mode={self.mode!r}) is not differentiable")
        if self.mode == "recompute":
            return _sweep(op, op.memo, v)
        flat = tuple(t for u in _uppers(op)[1] for t in u) + _learnable(op)
        if not flat:                    # nothing above reaches the steps: no indirect term
            return None
        h = _contract(op.memo, v)
        return flat, tuple(p.view_as(t) for p, t in zip(h.split([t.numel() for t in flat]), flat))


# --- recompute: √T checkpoints ----------------------------------------------------------------

@dataclass(frozen=True)
class _Checkpoints:
    """The iterates ``(θ_k, s_k)`` at ``k = 0, c, 2c, …`` of a ``steps``-step unroll."""

    marks: tuple
    every: int
    steps: int

    def segments(self):
        """``(start iterate, its number of steps)``, last segment first."""
        for i in reversed(range(len(self.marks))):
            yield self.marks[i], min(self.every, self.steps - i * self.every)


def _checkpointed(op, theta, state, steps):
    """``θ_T`` without graph, and the checkpoints the sweep restarts from."""
    every, marks = segment_length(steps), []
    for k in range(steps):
        if k % every == 0:
            marks.append((theta, state))
        theta, state = _detached(*_step(op, theta, state, False))
    return theta, _Checkpoints(tuple(marks), every, steps)


def _segment(op, start, n):
    """The ``n`` iterates of one segment, recomputed from its checkpoint without graph
    (the same steps as the unroll: bitwise the same iterates)."""
    trajectory = [start]
    for _ in range(n - 1):
        trajectory.append(_detached(*_step(op, *trajectory[-1], False)))
    return trajectory


class _Adjoint:
    """The sweep's running adjoints: of ``θ_k``, of ``s_k``, and the uppers' accumulated
    ``Σ_k (∂Φ/∂x)ᵀ a_{k+1}`` (None while nothing reached them)."""

    def __init__(self, v):
        self.theta, self.state, self.acc = v, None, None

    def back(self, op, theta, state, flat):
        """Rebuild the step from ``(θ_k, s_k)`` with its graph and pull the adjoints back."""
        theta, state, st = _leaves(theta, state)
        new_theta, new_state = _step(op, theta, state, True)
        new_st = tree.tensors(new_state)
        outs, cots = new_theta + new_st, self.theta + (self.state or tree.zeros(new_st))
        with autocast_off():
            grads = torch.autograd.grad(outs, theta + st + flat, cots, allow_unused=True)
        n, m = len(theta), len(st)
        self.theta = tree.fill_none(grads[:n], theta)
        self.state = tree.fill_none(grads[n:n + m], st) or ()
        step_up = tree.fill_none(grads[n + m:], flat)
        if step_up is not None:
            self.acc = step_up if self.acc is None else tree.add(self.acc, step_up)


def _sweep(op, checkpoints, v):
    """The reverse sweep, segment by segment: at most one segment's iterates live."""
    flat, adjoint = _upper_tensors(op), _Adjoint(v)
    for start, n in checkpoints.segments():
        trajectory = _segment(op, start, n)
        while trajectory:
            adjoint.back(op, *trajectory.pop(), flat)
    return (flat, adjoint.acc) if adjoint.acc is not None else None


def _learnable(op):
    """The lower optimizer's hyperparameters that are autograd leaves (an upper's learnable
    step size): the step depends on them through the update, not the loss."""
    hyper = getattr(op.problem.optimizer, "hyper", None)
    values = list(hyper.items().values()) if hyper is not None else []
    return tuple(t for t in tree.tensors(values) if t.requires_grad)


def _upper_tensors(op):
    """What the sweep differentiates: the uppers the loss reads, then the learnable
    hyperparameters it does not (each tensor once: autograd sums its paths)."""
    loss = tuple(t for u in _uppers(op)[1] for t in u)
    seen = {id(t) for t in loss}
    return loss + tuple(t for t in _learnable(op) if id(t) not in seen)


# --- forward: batched tangents --------------------------------------------------------------

def _forward(op, theta, state, steps):
    """Forward-mode unroll: ``θ_T`` and the tangents ``Z_T = dθ_T/dx``, one tensor per
    parameter with the ``m`` directions first."""
    idx, uppers = _uppers(op)
    uppers = tuple(tree.detach(u, True) for u in uppers)
    others = dict(zip(idx, uppers))
    jvp = _BatchedJvp(tuple(t for u in uppers for t in u) + _learnable(op))
    theta, state = _detached(theta, state)
    if not jvp.m:
        for _ in range(steps):
            theta, state = _detached(*_step(op, theta, state, False))
        return theta, ()
    z = (None,) * (len(theta) + len(tree.tensors(state)))   # (Z, S)_0 = 0
    for _ in range(steps):
        theta, state, z = _tangent_step(op, theta, state, others, z, jvp)
    return theta, tuple(torch.zeros((jvp.m,) + t.shape, dtype=t.dtype, device=t.device)
                        if zi is None else zi for zi, t in zip(z[:len(theta)], theta))


def _tangent_step(op, theta, state, others, z, jvp):
    """``Φ`` at ``(θ_k, s_k)`` and the pushed-forward tangents ``(Z, S)_{k+1}``."""
    theta, state, st = _leaves(theta, state)
    new_theta, new_state = _step(op, theta, state, True, others)
    z = jvp(new_theta + tree.tensors(new_state), theta + st, z)
    return _detached(new_theta, new_state) + (z,)


def _unit_rows(xs, a, b):
    """``e_j`` for ``a ≤ j < b``: rows of the ``m × m`` identity, split per upper tensor as
    ``(b − a, *shape)`` (``(b − a)·m`` numbers, never the whole identity)."""
    sizes = [t.numel() for t in xs]
    rows = torch.zeros(b - a, sum(sizes), dtype=xs[0].dtype, device=xs[0].device)
    rows.diagonal(a).fill_(1)
    return tuple(p.reshape((b - a,) + t.shape) for p, t in zip(rows.split(sizes, dim=1), xs))


class _BatchedJvp:
    """``J t_j`` for the ``m`` directions ``t_j = (z_j, e_j)``, ``J = ∂outs/∂(ins, x)``, by the
    double-backward trick (module docstring), :data:`DIRECTIONS_PER_BATCH` at a time.
    None stands for a zero tangent, in and out."""

    def __init__(self, xs):
        self.xs, self.m, self.batched = xs, sum(t.numel() for t in xs), True
        self.single = _unit_rows(xs, 0, self.m) if 0 < self.m <= DIRECTIONS_PER_BATCH else None

    def __call__(self, outs, ins, z):
        live = [o for o in outs if o.requires_grad]
        u = [torch.zeros_like(o, requires_grad=True) for o in live]
        with autocast_off():
            w = torch.autograd.grad(live, ins + self.xs, u, create_graph=True, allow_unused=True) if live else ()
        keep = [i for i, wi in enumerate(w) if wi is not None and wi.requires_grad
                and (i >= len(ins) or z[i] is not None)]
        if not keep:
            return (None,) * len(outs)
        ws = [w[i] for i in keep]
        batches = [self._batch(ws, u, self._tangents(keep, z, a)) for a in range(0, self.m, DIRECTIONS_PER_BATCH)]
        jt = iter([None if c[0] is None else c[0] if len(c) == 1 else torch.cat(c) for c in zip(*batches)])
        return tuple(next(jt) if o.requires_grad else None for o in outs)

    def _tangents(self, keep, z, a):
        """The tangents of the inputs in ``keep`` for the directions ``a … a + batch``."""
        b = min(a + DIRECTIONS_PER_BATCH, self.m)
        t = tuple(None if zi is None else zi[a:b] for zi in z) + (self.single or _unit_rows(self.xs, a, b))
        return [t[i] for i in keep]

    def _batch(self, ws, u, ts):
        with autocast_off():
            return self._pushed(ws, u, ts)

    def _pushed(self, ws, u, ts):
        if self.batched:
            try:
                return torch.autograd.grad(ws, u, ts, retain_graph=True, allow_unused=True,
                                           is_grads_batched=True)
            except RuntimeError as err:
                self.batched = False
                warnings.warn(MlocWarning(f"itd(mode='forward'): the tangent directions could not be batched "
                                          f"({str(err).splitlines()[0]}); pushing them one at a time "
                                          f"({self.m} backwards per step instead of one)"), stacklevel=2)
        rows = [torch.autograd.grad(ws, u, [t[j] for t in ts], retain_graph=True, allow_unused=True)
                for j in range(ts[0].shape[0])]
        return tuple(None if r[0] is None else torch.stack(r) for r in zip(*rows))


def _contract(z, v):
    """``Z_Tᵀ v``: ``h_j = Σ_i ⟨Z_i[j], v_i⟩`` over the lower's tensors ``i``, for every
    direction ``j`` (a vector of ``m``)."""
    h = z[0].reshape(z[0].shape[0], -1) @ v[0].reshape(-1)
    for zi, vi in zip(z[1:], v[1:]):
        h = h + zi.reshape(zi.shape[0], -1) @ vi.reshape(-1)
    return h
