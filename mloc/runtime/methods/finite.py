"""Hessian-free BR-VJPs: identity (or diagonal) Hessian, mixed product by finite differences.

All three need first-order autograd only, which is why they scale (no graph of the
gradient is kept). They are exact only when the lower problem's Hessian is the identity
(``finite_diff``) or the inverse of the optimizer's diagonal preconditioner (``sama``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from mloc.runtime import tree


def _not_differentiable(name):
    return NotImplementedError(
        f"{name} is not differentiable; under `exact` semantics a problem below a middle "
        "level with feedback needs cg, neumann or first_order")


def _guarded_losses(op, plus, minus, device_type, autocast):
    """Both losses in fp32 with autocast off; module buffers (BatchNorm statistics) restored."""
    saved = [b.clone() for b in op.buffers]
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        losses = op.loss_at(plus), op.loss_at(minus)
    with torch.no_grad():
        for b, s in zip(op.buffers, saved):
            b.copy_(s)
    return losses


def central_difference(op, q, eps):
    r"""The mixed product ``-J_xᵀ q`` by central differences of the loss in ``θ``.

    .. math::
        -J_x^\top q \approx -\frac{\nabla_x L(\theta + \epsilon q, x) - \nabla_x L(\theta - \epsilon q, x)}{2\epsilon},
        \quad \epsilon = \epsilon_0 / \lVert q\rVert

    Returned as the spec ``((L₊, L₋), (-1/2ε, 1/2ε))``: the upper's gradient of both losses
    in one backward. The perturbed points are built without graph, so only ``x`` is
    differentiated. Module buffers are restored afterwards and autocast is switched off
    (round-off grows like ``1/ε``). Liu et al., "DARTS", ICLR 2019, eq. 8.
    """
    with torch.no_grad():
        e = eps / tree.norm(q).clamp_min(torch.finfo(q[0].dtype).tiny)  # q = 0: no nan
        plus = tree.axpy(e, q, op.theta)
        minus = tree.axpy(-e, q, op.theta)
        c = 0.5 / e
    device_type = q[0].device.type
    autocast = torch.is_autocast_enabled(device_type)
    if op.buffers or autocast:
        return _guarded_losses(op, plus, minus, device_type, autocast), (-c, c)
    return (op.loss_at(plus), op.loss_at(minus)), (-c, c)  # the common case: nothing to guard


@dataclass(frozen=True)
class finite_diff:
    """Betty's ``darts``: ``q = v`` (identity Hessian), mixed product by central differences.

    Exact when ``H = I``; about 3G per BR-VJP and no second-order autograd. Liu et al.,
    "DARTS: Differentiable Architecture Search", ICLR 2019 (without the ``ξ`` factor: use
    ``sama``, which keeps the lower optimizer's step size, for that).
    """

    eps: float = 0.01

    def prepare(self, op):
        return op.theta

    def vjp(self, op, v, create_graph=False):
        if create_graph:
            raise _not_differentiable("finite_diff")
        return central_difference(op, v, self.eps)


@dataclass(frozen=True)
class sama(finite_diff):
    r"""SAMA: finite differences on ``q = s ⊙ v``, ``s`` = the lower optimizer's ``diag``.

    ``s = -∂Δθ/∂g`` of the lower optimizer's next step at the current gradient and state
    (``optim.Optimizer.diag``): ``η`` for SGD (with momentum/Nesterov factors), the exact
    elementwise derivative of the bias-corrected step for Adam/AdamW. The learning rate is
    always part of ``s``, so the meta step scale does not change with the base optimizer.
    With SGD it is one-step DARTS with ``ξ = η``, i.e. ITD with one step. Exact when
    ``H = diag(1/s)``. Choe et al., "Making Scalable Meta Learning Practical", NeurIPS 2023.
    """

    def vjp(self, op, v, create_graph=False):
        if create_graph:
            raise _not_differentiable("sama")
        problem = op.problem
        opt = problem.optimizer
        if opt is None or opt.diag is None:
            raise ValueError(f"sama needs the diagonal of {problem.name!r}'s optimizer "
                             "(optim.Optimizer.diag); this optimizer has none")
        grads = None
        if opt.diag_uses_grad:
            grads = torch.autograd.grad(problem.loss(*op.args), op.theta)
        s = opt.diag(grads, problem.state, op.theta)
        return central_difference(op, tree.mul(s, v), self.eps)


@dataclass(frozen=True)
class first_order:
    """First order (FO-MAML): drop the indirect term, ``dθ*/dx ≈ 0`` for the uppers.

    Finn et al., "Model-Agnostic Meta-Learning", ICML 2017, §5.2. Exact when the lower's
    best response does not depend on the upper (``dθ'/dθ₀ = I`` in MAML's reparametrised
    form, where the upper evaluates the lower's point directly).
    """

    zero = True  # the composer skips it: no seed, no BR-VJP

    def prepare(self, op):
        return op.theta

    def vjp(self, op, v, create_graph=False):
        return None
