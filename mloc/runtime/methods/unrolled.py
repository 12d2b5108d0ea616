r"""Iterative differentiation (ITD): differentiate through ``K`` optimizer steps.

``θ_{k+1} = θ_k + u(∇_θ L(θ_k, x), s_k, θ_k)`` with the lower problem's own functional
optimizer (``optim``), started at its current parameters and state. The uppers then see
``θ_K``; the BR-VJP is ``(dθ_K/dx)ᵀ v``, exact for the unrolled program whatever ``K``
(Maclaurin et al., "Gradient-based Hyperparameter Optimization through Reversible
Learning", ICML 2015; Franceschi et al., "Forward and Reverse Gradient-Based
Hyperparameter Optimization", ICML 2017). The unroll is a look-ahead: it does not commit
the lower's parameters or state; the training loop steps the lower itself.

Modes (same result, different memory):

- ``reverse``: keep the graph of the last ``T = truncate or K`` steps, one reverse sweep;
  the first ``K - T`` steps run without graph (truncated back-propagation; Shaban et al.,
  "Truncated Back-propagation for Bilevel Optimization", AISTATS 2019).
- ``recompute``: store only the iterates and optimizer states, rebuild each step's graph
  during the sweep (``K·d`` memory instead of ``K`` graphs; about twice the time).
- ``forward``: carry ``Z = dθ_k/dx`` (and the optimizer state's tangents) with one JVP
  (``torch.func.jvp`` over ``torch.func.grad``) per upper direction per step: memory
  ``d·m`` instead of ``K·d``, worth it when the uppers have few parameters ``m``. The loss
  closure must be functional (no in-place updates of captured tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mloc.runtime.base import tree
from mloc.runtime.optim import apply_updates, keep_absent

_MODES = ("reverse", "forward", "recompute")


def _step(op, theta, state, create_graph):
    """One unrolled step. A parameter the loss does not reach stays where it is, with its
    optimizer state, as in the committed step (``optim.commit_present``)."""
    g = tree.dense(torch.autograd.grad(op.loss_at(theta), theta, create_graph=create_graph,
                                       allow_unused=True), theta)
    updates, new = op.problem.optimizer.update(g, state, theta)
    missing = tree.absent(g)
    if not missing:
        return apply_updates(theta, updates), new
    theta = tuple(t if i in missing else t + u for i, (t, u) in enumerate(zip(theta, updates)))
    return theta, keep_absent(new, state, missing, len(theta))


def _detached(theta, state):
    st = tree.detach(tree.tensors(state))
    return tree.detach(theta, True), tree.replace_tensors(state, st)


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
            op.memo = []
            for _ in range(self.kept):
                op.memo.append((theta, state))
                theta, state = _detached(*_step(op, theta, state, False))
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
        idx, uppers = _uppers(op)
        flat = tuple(t for u in uppers for t in u)
        h = torch.stack([tree.dot(v, z) for z in op.memo])
        return flat, tuple(p.view_as(t) for p, t in zip(h.split([t.numel() for t in flat]), flat))


def _sweep(op, trajectory, v):
    """Reverse sweep over stored iterates, rebuilding one step's graph at a time."""
    _, uppers = _uppers(op)
    flat = tuple(t for u in uppers for t in u)
    a_theta, a_state, acc = v, None, None
    for theta, state in reversed(trajectory):
        theta = tree.detach(theta, True)
        st = tree.detach(tree.tensors(state), True)
        new_theta, new_state = _step(op, theta, tree.replace_tensors(state, st), True)
        new_st = tree.tensors(new_state)
        outs, cots = new_theta + new_st, a_theta + (a_state or tree.zeros(new_st))
        grads = torch.autograd.grad(outs, theta + st + flat, cots, allow_unused=True)
        n, m = len(theta), len(st)
        a_theta = tree.fill_none(grads[:n], theta)
        a_state = tree.fill_none(grads[n:n + m], st) or ()
        step_up = tree.fill_none(grads[n + m:], flat)
        if step_up is not None:
            acc = step_up if acc is None else tree.add(acc, step_up)
    return (flat, acc) if acc is not None else None


def _forward(op, theta, state, steps):
    """Forward-mode unroll: returns ``θ_K`` and the tangents ``dθ_K/dx_j``, one per ``j``."""
    idx, uppers = _uppers(op)
    opt = op.problem.optimizer
    flat = [t for u in uppers for t in u]
    m = sum(t.numel() for t in flat)
    eye = torch.eye(m, dtype=flat[0].dtype, device=flat[0].device)
    shapes = [len(u) for u in uppers]
    theta, st = tree.detach(theta), tree.detach(tree.tensors(state))
    uppers = tuple(tree.detach(u) for u in uppers)
    z = [(tree.zeros(theta), tree.zeros(st)) for _ in range(m)]
    for _ in range(steps):
        before, after = state, []

        def fn(th, s, up):
            others = dict(zip(idx, up))
            g = torch.func.grad(lambda t: op.loss_at(t, others))(th)
            upd, new = opt.update(g, tree.replace_tensors(before, s), th)
            after.append(new)       # its non-tensor leaves (a step count) carry on
            return apply_updates(th, upd), tree.tensors(new)

        new_z = []
        for j in range(m):
            tangent = _unflatten(eye[j], flat, shapes)
            (nth, nst), (zt, zs) = torch.func.jvp(fn, (theta, st, uppers), (*z[j], tangent))
            new_z.append((zt, zs))
        theta, st, z = nth, nst, new_z
        state = tree.replace_tensors(after[-1], st)
    return theta, [zt for zt, _ in z]


def _unflatten(row, flat, shapes):
    pieces = [p.view_as(t) for p, t in zip(row.split([t.numel() for t in flat]), flat)]
    out, i = [], 0
    for n in shapes:
        out.append(tuple(pieces[i:i + n]))
        i += n
    return tuple(out)
