"""Hessian-free BR-VJPs: identity (or diagonal) Hessian, mixed product by finite differences.

All three need first-order autograd only, which is why they scale (no graph of the
gradient is kept). They are exact only when the lower problem's Hessian is ``I/ξ``
(``finite_diff``, ``ξ = 1`` by default) or the inverse of the optimizer's diagonal
preconditioner (``sama``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mloc.runtime.base import tree
from mloc.runtime.base.precision import autocast_off
from mloc.runtime.base.overlap import averaged_grad


def _not_differentiable(name):
    return NotImplementedError(
        f"{name} is not differentiable; under `exact` semantics a problem below a middle "
        "level with feedback needs cg, neumann or first_order")


# Cheap on the hot path: torch.finfo(dtype) builds new objects through code that little
# else runs; out of cache it costs ~15 µs per step on the benchmark (0.2 µs when warm), so
# the dtype's tiny is a dict lookup.
_TINY = {t: torch.finfo(t).tiny for t in (torch.float16, torch.bfloat16, torch.float32,
                                          torch.float64)}  # smallest normals: ‖q‖ = 0 guard


def _perturbed_losses(loss_at, plus, minus, buffers):
    """Both losses in full precision (:func:`autocast_off`: their round-off is divided by
    ``2ε``), module buffers (BatchNorm statistics) restored when there are any."""
    with autocast_off():
        if not buffers:             # the common case: nothing to guard
            return loss_at(plus), loss_at(minus)
        saved = [b.clone() for b in buffers]
        losses = loss_at(plus), loss_at(minus)
    with torch.no_grad():
        for b, s in zip(buffers, saved):
            b.copy_(s)
    return losses


class _Quotient(torch.autograd.Function):
    """Identity on the tensors a finite difference reads besides ``θ``. Both perturbed losses
    read the same outputs, so autograd sums their gradients here, ``g = ∇L₊ − ∇L₋`` (the
    losses are differentiated with cotangents ``1`` and ``−1``), before this backward turns
    ``g`` into the difference quotient ``−g / 2ε``. Subtracting first, then dividing, is
    how the quotient is written by hand (and by Betty): the two gradients nearly cancel,
    so their difference is exact where scaling each by ``∓1/2ε`` first would round both."""

    @staticmethod
    def forward(ctx, two_e, *tensors):
        ctx.two_e = two_e
        ctx.set_materialize_grads(False)   # an output no loss reads: no gradient, not zeros
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_quotients(grads, ctx.two_e))


def _quotients(grads, two_e):
    """``−g / 2ε`` for each ``g`` (``None`` stays ``None``): one division by ``−2ε`` each,
    which is exactly ``−(g / 2ε)``."""
    neg = -two_e
    return [None if g is None else g / neg for g in grads]


def _quotient_views(two_e, groups):
    """``groups`` (tuples of tensors) as views through one :class:`_Quotient`."""
    flat = [t for g in groups for t in g]
    if not flat:
        return tuple(groups)
    views = _Quotient.apply(two_e, *flat)
    if isinstance(views, torch.Tensor):
        views = (views,)
    out, i = [], 0
    for g in groups:
        out.append(tuple(views[i:i + len(g)]))
        i += len(g)
    return tuple(out)


_MINUS_ONE: dict = {}


def _minus_one(like):
    """A cached 0-dim ``-1`` of ``like``'s dtype and device (the second loss's cotangent)."""
    key = (like.dtype, like.device)
    t = _MINUS_ONE.get(key)
    if t is None:
        t = _MINUS_ONE[key] = torch.full((), -1.0, dtype=like.dtype, device=like.device)
    return t


def _spec(lp, lm):
    """The VJP spec of the two perturbed losses (cotangents 1 and −1; see :class:`_Quotient`),
    or ``None`` when neither reaches anything."""
    if lp.requires_grad and lm.requires_grad:
        return (lp, lm), (None, _minus_one(lm))
    if lp.requires_grad:
        return (lp,), (None,)
    if lm.requires_grad:
        return (lm,), (_minus_one(lm),)
    return None


def central_difference(op, q, eps):
    r"""The mixed product ``-J_xᵀ q`` by central differences of the loss in ``θ``.

    .. math::
        -J_x^\top q \approx -\frac{\nabla_x L(\theta + \epsilon q, x) - \nabla_x L(\theta - \epsilon q, x)}{2\epsilon},
        \quad \epsilon = \epsilon_0 / \lVert q\rVert

    Returned as the spec ``((L₊, L₋), (1, −1))`` over the loss's other arguments read
    through :class:`_Quotient`, which divides the summed gradient by ``−2ε``: the upper's
    gradient of both losses in one backward. The perturbed points are built without graph,
    so only ``x`` is differentiated. Module buffers are restored afterwards and autocast is
    switched off (round-off grows like ``1/ε``). Liu et al., "DARTS", ICLR 2019, eq. 8.
    """
    with torch.no_grad():
        dtype = q[0].dtype
        tiny = _TINY.get(dtype) or torch.finfo(dtype).tiny
        e = eps / tree.norm(q).clamp_min(tiny)  # q = 0: no nan
        plus = tree.axpy(e, q, op.theta)
        minus = tree.axpy(-e, q, op.theta)
        two_e = 2 * e
    i = op.problem.index
    others = [j for j in range(len(op.args)) if j != i]
    views = dict(zip(others, _quotient_views(two_e, [op.args[j] for j in others])))

    def loss_at(point):
        return op.loss_at(point, views)
    return _spec(*_perturbed_losses(loss_at, plus, minus, op.buffers))


def two_level_step(lower, args, buffers, eps, direction, upper_loss, upper_args, seeds, params):
    r"""The whole hypergradient step of a two-level program, specialized once: a closure.

    For an upper ``x`` whose loss ``F`` reads only the lower ``θ``, and a finite-difference
    BR-VJP, one step is

    .. math::
        v = \nabla_\theta F(\theta),\quad q = v,\ \xi v \text{ or } s \odot v,\quad
        x.\mathrm{grad} \mathrel{+}= -\frac{\nabla_x L(\theta + \epsilon q, x)
        - \nabla_x L(\theta - \epsilon q, x)}{2\epsilon},\quad \epsilon = \epsilon_0/\lVert q\rVert

    (``q = direction(lower, args, θ, v)``: ``ξ v``, ``s ⊙ v`` for ``sama``; ``None``: ``v``): the composer's
    seed → ``vjp`` (:func:`central_difference`) → final backward with the same numbers, as
    one flat function; the quotient ``(∇L₊ − ∇L₋)/(−2ε)`` is formed after the backward here,
    in the general path's :class:`_Quotient` node there. Bound once: both losses, the
    arguments around ``θ`` (``args``: live parameter tuples in ``reads`` order), the seed
    tensors ``seeds`` (the flat ``θ``), the upper's ``params``, the ``buffers`` to guard.
    Read every step: the lower's optimizer state (the training loop replaces it) and the
    dtype and device of ``q`` (a module may be moved or cast in place).
    """
    i = lower.index
    theta, before, after, loss = args[i], tuple(args[:i]), tuple(args[i + 1:]), lower.loss
    grad = torch.autograd.grad
    no_grad = torch.no_grad

    def loss_at(point):
        return loss(*before, point, *after)

    def step(accumulate=True, seed=None):
        top = upper_loss(*upper_args)
        with autocast_off():      # autocast wraps the forwards only
            q = grad(top if seed is None else seed(top), seeds, allow_unused=True)
        for g in q:
            if g is None:  # rare: the upper's loss ignores part of θ
                q = tree.fill_none(q, theta)
                if q is None:
                    return None
                break
        if direction is not None:
            q = direction(lower, args, theta, q)
        with no_grad():
            plus, minus, two_e = _perturbed(q, theta, eps)
        spec = _spec(*_perturbed_losses(loss_at, plus, minus, buffers))
        if spec is None:
            return None
        # ∇L₊ − ∇L₋ in one backward (cotangents 1, −1), then the quotient (_Quotient's)
        with autocast_off():      # bf16 products here would be divided by 2ε
            diff = grad(spec[0], params, spec[1], allow_unused=True)
        h = _quotients(diff, two_e)     # no graph: the gradients carry none
        if not accumulate:
            return tuple(h)
        _accumulate(params, h)
        return None

    return step


def _perturbed(q, theta, eps):
    """``θ ± εq`` and ``2ε``, ``ε = ε₀/‖q‖`` (``tree.norm`` and ``tree.axpy(±ε, q, θ)``
    inlined; the caller holds ``no_grad``)."""
    q0 = q[0]
    total = (q0 * q0).sum()
    for x in q[1:]:
        total = total + (x * x).sum()
    dtype = q0.dtype
    tiny = _TINY.get(dtype) or torch.finfo(dtype).tiny
    e = eps / torch.sqrt(total).clamp_min(tiny)  # q = 0: no nan
    plus = tuple([e * x + p for x, p in zip(q, theta)])
    e_minus = -e
    minus = tuple([e_minus * x + p for x, p in zip(q, theta)])
    return plus, minus, 2 * e


def _accumulate(params, grads):
    """``p.grad += g`` as ``loss.backward()`` accumulates (``None``: nothing reached ``p``)."""
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g


@dataclass(frozen=True)
class _CentralDifference:
    """What ``finite_diff`` and ``sama`` share: ``eps`` and where the uppers read the lower."""

    eps: float = 0.01

    def prepare(self, op):
        return op.theta


@dataclass(frozen=True)
class finite_diff(_CentralDifference):
    r"""Betty's ``darts``: ``q = ξ v`` (identity Hessian), mixed product by central differences.

    DARTS' second-order approximation (Liu et al., "DARTS: Differentiable Architecture
    Search", ICLR 2019, eq. 7–8) differentiates the upper's loss through one unrolled step
    ``w' = w − ξ ∇_w L_train(w, α)`` of the weights:

    .. math::
        \nabla_\alpha L_{val}(w', \alpha)
        - \xi\, \nabla^2_{\alpha, w} L_{train}(w, \alpha)\, \nabla_{w'} L_{val}(w', \alpha),

    the mixed product by central differences at ``w ± ε v`` (eq. 8). Here ``w'`` is the
    lower's current iterate (the lower steps before the upper, as in Betty), ``v = ∇_θ F``,
    and the BR-VJP is ``−ξ J_xᵀ v``: ``q = ξ v``, the perturbation ``ε = ε₀/‖q‖`` (the same
    points ``θ ± ε₀ v/‖v‖`` for every ``ξ``). ``xi`` is the unrolled step's size: ``1`` (the
    default, and Betty's ``darts``) is the implicit function theorem with ``H = I``; DARTS
    takes the weights' learning rate, where over an SGD lower this equals ``sama``
    (``s = η``) and one-step ``itd`` to first order. Exact when ``H = I/ξ``; about 3G per
    BR-VJP and no second-order autograd.
    """

    xi: float = 1.0

    def _direction(self):
        """``q`` from ``v`` for :func:`two_level_step`: ``None`` (``q = v``) at ``ξ = 1``, so
        the default computes what it did before ``xi`` existed, bit for bit."""
        if self.xi == 1:
            return None
        xi = self.xi
        return lambda lower, args, theta, v: tree.scale(xi, v)

    def vjp(self, op, v, create_graph=False):
        if create_graph:
            raise _not_differentiable("finite_diff")
        return central_difference(op, v if self.xi == 1 else tree.scale(self.xi, v), self.eps)

    def two_level(self, lower, args, buffers, upper_loss, upper_args, seeds, params):
        """The straight-line two-level step (:func:`two_level_step`), built once per plan."""
        return two_level_step(lower, args, buffers, self.eps, self._direction(), upper_loss,
                              upper_args, seeds, params)


@dataclass(frozen=True)
class sama(_CentralDifference):
    r"""SAMA: finite differences on ``q = s ⊙ v``, ``s`` = the lower optimizer's ``diag``.

    ``s = -∂Δθ/∂g`` of the lower optimizer's next step at the current gradient and state
    (``optim.Optimizer.diag``): ``η`` for SGD (with momentum/Nesterov factors), the exact
    elementwise derivative of the bias-corrected step for Adam/AdamW. The learning rate is
    always part of ``s``, so the meta step scale does not change with the base optimizer.
    With SGD it is one-step DARTS with ``ξ = η`` (``finite_diff(xi=η)``), i.e. ITD with one
    step. Exact when ``H = diag(1/s)``. Choe et al., "Making Scalable Meta Learning
    Practical", NeurIPS 2023.
    """

    def vjp(self, op, v, create_graph=False):
        if create_graph:
            raise _not_differentiable("sama")
        return central_difference(op, _preconditioned(op.problem, op.args, op.theta, v), self.eps)

    def two_level(self, lower, args, buffers, upper_loss, upper_args, seeds, params):
        return two_level_step(lower, args, buffers, self.eps, _preconditioned, upper_loss,
                              upper_args, seeds, params)


def _preconditioned(problem, args, theta, v):
    """``q = s ⊙ v``, ``s`` the lower optimizer's ``diag`` at its current gradient and state
    (the state is read here, every step: the training loop replaces it)."""
    opt = problem.optimizer
    if opt is None or not opt.has_diag:
        raise ValueError(f"sama needs the diagonal of {problem.name!r}'s optimizer "
                         "(optim.Optimizer.diag); this optimizer has none")
    grads = None
    if opt.diag_uses_grad:
        loss = problem.loss(*args)
        with autocast_off():      # autocast wraps the forwards only
            if problem.reduce is not None:   # the gradient of the whole data-parallel batch
                grads = averaged_grad(problem.reduce, loss, theta)
            else:
                grads = torch.autograd.grad(loss, theta)
    return tree.mul(opt.diag(grads, problem.state, theta), v)


@dataclass(frozen=True)
class first_order:
    """First order (FO-MAML): drop the indirect term, ``dθ*/dx ≈ 0`` for the uppers.

    The composer skips it (``MethodCaps.no_indirect`` in its descriptor): no seed, no
    BR-VJP.

    Finn et al., "Model-Agnostic Meta-Learning", ICML 2017, §5.2. Exact when the lower's
    best response does not depend on the upper (``dθ'/dθ₀ = I`` in MAML's reparametrised
    form, where the upper evaluates the lower's point directly).
    """

    def prepare(self, op):
        return op.theta

    def vjp(self, op, v, create_graph=False):
        return None
