"""Functional, differentiable optimizers in the style of optax, for PyTorch.

An optimizer is a pure pair ``init(params) -> state`` and
``update(grads, state, params) -> (updates, state)``; the new parameters are
``params + updates`` (:func:`apply_updates`). Nothing is mutated, so an unrolled
loop (``itd``) differentiates through ``update`` with respect to the parameters, the
gradients, and any hyperparameter given as a tensor (e.g. a learnable learning rate).

Each optimizer also exposes ``diag(grads, state, params)``: the diagonal of
``-∂update/∂grad`` of the *next* update taken from ``state`` at ``grads``, the
preconditioner ``s`` of SAMA (Choe et al., "Making Scalable Meta Learning Practical",
NeurIPS 2023). It is returned per parameter tensor, as a tensor or a number that
broadcasts. ``diag_uses_grad`` says whether it reads ``grads`` (SGD's does not), so SAMA
skips a gradient evaluation when it can.

States are small NamedTuples: a Python ``count`` of steps taken (no host sync to read it)
and tuples of tensors. :func:`state_tensors` / :func:`with_state_tensors` flatten them for
unrolled differentiation. The numerics follow ``torch.optim``
operation for operation, so a functional run matches the stateful one to rounding.

A later optimizer (Shampoo: matrix statistics, a non-differentiable root every k steps)
fits the same interface: its state holds the statistics, and ``update`` may be run under
``torch.no_grad`` by the caller; register it in :data:`OPTIMIZERS`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from mloc.runtime.tree import Params


class Optimizer(NamedTuple):
    """A functional optimizer: pure ``init``/``update`` plus SAMA's ``diag``.

    ``step_(grads, state, params) -> state``, when given, commits one step in place (the
    parameters and the state's tensors are overwritten) with exactly ``torch.optim``'s
    operations: its single-tensor loop on the CPU, its multi-tensor (``_foreach``) form
    elsewhere, as ``torch.optim`` chooses by default (``step_.single`` and ``step_.multi``
    are the two forms). A committed run is bit-identical to ``torch.optim``'s on the CPU,
    with ``foreach=False`` or ``True``;
    :func:`step` uses it, and it leaves a state that ``update`` and ``diag`` read as they
    would the functional one. It is ``None`` when a hyperparameter is a tensor (a learning
    rate schedule, a learnable hyperparameter): ``torch.optim`` would read such a tensor
    back to the host, so those commits take the functional path.
    """

    init: Callable[[Params], Any]
    update: Callable[[Params, Any, Params], tuple[Params, Any]]
    diag: Callable[[Params | None, Any, Params], tuple]
    diag_uses_grad: bool
    hyper: dict
    step_: Callable[[Params, Any, Params], Any] | None = None


class SGDState(NamedTuple):
    count: int
    momentum: Params


class AdamState(NamedTuple):
    count: int
    mu: Params
    nu: Params


def _is_zero(x) -> bool:
    return not isinstance(x, Tensor) and x == 0


def _numbers(*values) -> bool:
    """No tensor among ``values`` (the in-place commits take plain numbers only)."""
    return not any(isinstance(v, Tensor) for v in values)


def _by_device(single_, multi_):
    """The in-place step: ``torch.optim``'s default choice between its two forms, made per
    call from where the parameters live. On the CPU, the single-tensor loop (there a
    foreach op only loops over the same single-tensor ops in C++, and a step's few extra
    kernel paths cost more than the Python loop they save); elsewhere (CUDA), the
    multi-tensor one: one kernel launch per operation for all tensors. Both give the same
    numbers on the CPU (tested)."""
    def step_(grads, state, params):
        if params and params[0].device.type != "cpu":
            return multi_(grads, state, params)
        return single_(grads, state, params)
    step_.single, step_.multi = single_, multi_
    return step_


def apply_updates(params: Params, updates: Params) -> Params:
    """``params + updates`` (differentiable, out of place)."""
    return tuple(p + u for p, u in zip(params, updates))


def sgd(lr, momentum=0.0, nesterov=False, weight_decay=0.0, dampening=0.0) -> Optimizer:
    r"""Stochastic gradient descent with heavy-ball or Nesterov momentum (torch.optim.SGD).

    .. math::
        g' = g + \text{wd}\,\theta,\quad
        b_t = \mu b_{t-1} + (1-\tau) g' \ (b_1 = g'),\quad
        \Delta\theta = -\eta\,(g' + \mu b_t \text{ if nesterov else } b_t)

    Polyak (1964); Sutskever et al., "On the importance of initialization and momentum in
    deep learning", ICML 2013. ``diag`` is ``η`` times ``1`` (no momentum),
    ``(1-τ)`` after the first step (``1`` on it), plus ``μ`` times that for Nesterov:
    the learning rate is always kept (Betty drops it for SGD, which changes the meta
    step scale whenever the base optimizer changes).
    """
    has_momentum = not _is_zero(momentum)
    if nesterov and (not has_momentum or not _is_zero(dampening)):
        raise ValueError("nesterov momentum requires momentum > 0 and dampening = 0")

    def init(params):
        buf = tuple(torch.zeros_like(p) for p in params) if has_momentum else ()
        return SGDState(0, buf)

    def update(grads, state, params):
        if not _is_zero(weight_decay):
            grads = tuple(g + weight_decay * p for g, p in zip(grads, params))
        if not has_momentum:
            return tuple(-lr * g for g in grads), SGDState(state.count + 1, ())
        if state.count == 0:
            buf = grads
        else:
            buf = tuple(momentum * b + (1 - dampening) * g for b, g in zip(state.momentum, grads))
        direction = tuple(g + momentum * b for g, b in zip(grads, buf)) if nesterov else buf
        return tuple(-lr * d for d in direction), SGDState(state.count + 1, buf)

    def diag(grads, state, params):
        c = 1.0
        if has_momentum:
            c = 1.0 if state.count == 0 else 1 - dampening
            c = 1 + momentum * c if nesterov else c
        return (lr * c,) * len(params)

    def plain_(grads, state, params):
        # no momentum, no weight decay: the whole of _single_tensor_sgd is this line
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr)
        return SGDState(state.count + 1, ())

    def single_(grads, state, params):
        # torch.optim.sgd._single_tensor_sgd, operation for operation
        first, bufs = state.count == 0, []
        for i, (p, g) in enumerate(zip(params, grads)):
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            if has_momentum:
                if first:
                    buf = g.detach().clone()
                else:
                    buf = state.momentum[i]
                    buf.mul_(momentum).add_(g, alpha=1 - dampening)
                bufs.append(buf)
                g = g.add(buf, alpha=momentum) if nesterov else buf
            p.add_(g, alpha=-lr)
        return SGDState(state.count + 1, tuple(bufs))

    def multi_(grads, state, params):
        # torch.optim.sgd._multi_tensor_sgd, operation for operation, except that the
        # caller's gradients are never written to
        if not params:
            return SGDState(state.count + 1, state.momentum)
        grads = list(grads)
        if weight_decay != 0:
            grads = torch._foreach_add(grads, list(params), alpha=weight_decay)
        bufs = ()
        if has_momentum:
            if state.count == 0:
                bufs = tuple(g.detach().clone() for g in grads)
            else:
                bufs = state.momentum
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads, alpha=1 - dampening)
            grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
        torch._foreach_add_(params, grads, alpha=-lr)
        return SGDState(state.count + 1, tuple(bufs))

    hyper = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                 dampening=dampening)
    simple = not has_momentum and weight_decay == 0
    inplace = (_by_device(plain_ if simple else single_, multi_)
               if _numbers(lr, momentum, weight_decay, dampening) else None)
    return Optimizer(init, update, diag, False, hyper, inplace)


def _adam(lr, betas, eps, weight_decay, decoupled: bool) -> Optimizer:
    b1, b2 = betas

    def init(params):
        zeros = lambda: tuple(torch.zeros_like(p) for p in params)  # noqa: E731
        return AdamState(0, zeros(), zeros())

    def moments(grads, state, params):
        if not decoupled and not _is_zero(weight_decay):
            grads = tuple(g + weight_decay * p for g, p in zip(grads, params))
        mu = tuple(m + (1 - b1) * (g - m) for m, g in zip(state.mu, grads))
        nu = tuple(b2 * v + (1 - b2) * g * g for v, g in zip(state.nu, grads))
        t = state.count + 1
        return grads, mu, nu, 1 - b1**t, 1 - b2**t

    def update(grads, state, params):
        _, mu, nu, c1, c2 = moments(grads, state, params)
        step, root_c2 = lr / c1, c2**0.5
        upd = tuple(-step * m / (torch.sqrt(v) / root_c2 + eps) for m, v in zip(mu, nu))
        if decoupled and not _is_zero(weight_decay):
            upd = tuple(u - lr * weight_decay * p for u, p in zip(upd, params))
        return upd, AdamState(state.count + 1, mu, nu)

    def diag(grads, state, params):
        # d/dg of  lr/c1 · m / (sqrt(v/c2) + eps), with m, v the moments after g:
        #   lr/c1 · [ (1-b1)/D  -  m (1-b2) g / (c2 sqrt(v/c2) D²) ],  D = sqrt(v/c2) + eps.
        # Bias correction is kept: s is the exact derivative of the step actually taken.
        g, mu, nu, c1, c2 = moments(grads, state, params)
        out = []
        for gi, m, v in zip(g, mu, nu):
            root = torch.sqrt(v / c2)
            d = root + eps
            curv = torch.where(root > 0, m * (1 - b2) * gi / (c2 * root * d * d), 0.0)
            out.append(lr / c1 * ((1 - b1) / d - curv))
        return tuple(out)

    def single_(grads, state, params):
        # torch.optim.adam._single_tensor_adam (decoupled_weight_decay for AdamW), operation
        # for operation; the step count is a Python int (torch.optim reads its step tensor
        # back to the host: the same float)
        t = state.count + 1
        step_size = lr / (1 - b1**t)
        root_c2 = (1 - b2**t) ** 0.5
        for p, g, m, v in zip(params, grads, state.mu, state.nu):
            if weight_decay != 0:
                if decoupled:
                    p.mul_(1 - lr * weight_decay)
                else:
                    g = g.add(p, alpha=weight_decay)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / root_c2).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)
        return AdamState(t, state.mu, state.nu)

    def multi_(grads, state, params):
        # torch.optim.adam._multi_tensor_adam, operation for operation
        t = state.count + 1
        if not params:
            return AdamState(t, state.mu, state.nu)
        step_size = lr / (1 - b1**t)
        root_c2 = (1 - b2**t) ** 0.5
        if weight_decay != 0:
            if decoupled:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            else:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
        torch._foreach_lerp_(state.mu, grads, 1 - b1)
        torch._foreach_mul_(state.nu, b2)
        torch._foreach_addcmul_(state.nu, grads, grads, 1 - b2)
        denom = torch._foreach_sqrt(state.nu)
        torch._foreach_div_(denom, root_c2)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, state.mu, denom, -step_size)
        return AdamState(t, state.mu, state.nu)

    hyper = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    inplace = _by_device(single_, multi_) if _numbers(lr, b1, b2, eps, weight_decay) else None
    return Optimizer(init, update, diag, True, hyper, inplace)


def adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0) -> Optimizer:
    r"""Adam with L2 weight decay added to the gradient (torch.optim.Adam).

    .. math::
        m_t = \beta_1 m_{t-1} + (1-\beta_1) g,\ v_t = \beta_2 v_{t-1} + (1-\beta_2) g^2,\
        \Delta\theta = -\frac{\eta}{1-\beta_1^t}\,\frac{m_t}{\sqrt{v_t/(1-\beta_2^t)} + \epsilon}

    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015. ``diag`` is the
    exact elementwise derivative of that step with respect to ``g`` (bias correction and
    ``ε`` included); with ``ε = 0`` it is SAMA's
    ``η√c₂/c₁ · [(1-β₁)β₂ v_{t-1} - β₁(1-β₂) g m_{t-1}] / v_t^{3/2}``.
    """
    return _adam(lr, betas, eps, weight_decay, decoupled=False)


def adamw(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2) -> Optimizer:
    r"""AdamW: Adam with decoupled weight decay ``Δθ -= η·wd·θ`` (torch.optim.AdamW).

    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019. The decay
    does not read ``g``, so ``diag`` is Adam's.
    """
    return _adam(lr, betas, eps, weight_decay, decoupled=True)


OPTIMIZERS: dict[str, Callable[..., Optimizer]] = {"sgd": sgd, "adam": adam, "adamw": adamw}


def state_tensors(state) -> Params:
    """The tensors of an optimizer state, flattened in field order (``count`` skipped)."""
    return tuple(t for field in state[1:] for t in field)


def with_state_tensors(state, tensors: Params):
    """``state`` with its tensors replaced by ``tensors`` (the inverse of the above)."""
    fields, i = [state[0]], 0
    for field in state[1:]:
        fields.append(tuple(tensors[i : i + len(field)]))
        i += len(field)
    return type(state)(*fields)


@torch.no_grad()
def step(opt: Optimizer, params: Params, state, grads: Params | None = None):
    """One in-place training step from ``.grad`` (or ``grads``); returns the new state.

    Generated loops call this to commit a step; nothing here is differentiated. With
    ``opt.step_`` the step is ``torch.optim``'s in-place one (the state's tensors are
    overwritten); otherwise ``params += update(grads, state, params)``.
    """
    if grads is None:
        grads = tuple(p.grad for p in params)
    if opt.step_ is not None:
        return opt.step_(grads, state, params)
    updates, state = opt.update(grads, state, params)
    for p, u in zip(params, updates):
        p.add_(u)
    return state
