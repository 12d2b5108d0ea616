"""Gradient sources: where a problem's step gets the gradients its commit pipeline takes.

A source is ``source(seed) -> (grads, loss)``: ``grads`` has one dense tensor per
parameter of the problem (zeros for a parameter the loss does not reach, whose index the
tuple records: :class:`~mloc.runtime.base.tree.Dense`, so the commit leaves that parameter as
``torch.optim`` leaves a ``.grad`` of None), ``loss`` is the
detached loss the step watched, or None. ``seed`` (from the problem's
:class:`~mloc.runtime.grad.commit.Pipeline`; None: nothing) is applied to the loss before
anything is differentiated: the fp16 loss scale, so the gradients come out scaled by it.

- :func:`plain_gradient`: a lower problem's step, ``∇_θ L(θ, ...)`` of its own loss at
  every problem's current parameters, the others' bound as constants where that applies
  (:meth:`BoundLoss.step_loss <mloc.runtime.program.binding.BoundLoss.step_loss>`);
- :func:`hypergradient`: an upper problem's step, ``dL/dx`` through the best responses of
  the problems below it (:meth:`Hierarchy.hypergrad <mloc.runtime.grad.compose.Hierarchy.hypergrad>`),
  which is homogeneous of degree one in the seed's scale.

A new kind of step (the chain step of interlocking problems) is a third function of the
same shape; the pipeline does not change.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from mloc.runtime.base import tree
from mloc.runtime.grad.commit import Seed
from mloc.runtime.base.precision import NULL_CONTEXT
from mloc.runtime.base.tree import Params

Source = Callable[[Seed | None], tuple[Params, Tensor | None]]


def plain_gradient(params: Params, loss_at_own: Callable[[], Tensor],
                   autocast: Callable[[], object], sync=None) -> Source:
    """The gradient of ``loss_at_own()`` (evaluated in the ``autocast`` context) with
    respect to ``params``, and the loss, detached. ``sync``
    (:class:`~mloc.runtime.base.overlap.OverlappedSync`): the gradient is averaged across
    replicas as the backward makes it (the pipeline's all-reduce then finds it done)."""
    grad = torch.autograd.grad
    if sync is not None:
        def grad(loss, inputs, allow_unused):
            return sync.grad(loss, inputs, final=True)
    evaluate = loss_at_own
    if autocast() is not NULL_CONTEXT:
        def evaluate() -> Tensor:
            with autocast():
                return loss_at_own()

    def gradient(seed: Seed | None = None) -> tuple[Params, Tensor]:
        loss = evaluate()
        grads = grad(loss if seed is None else seed(loss), params, allow_unused=True)
        for g in grads:
            if g is None:   # rare: part of the problem's parameters is unused (marked absent)
                grads = tree.dense(grads, params)
                break
        return grads, loss.data     # detached (the cheapest way)
    return gradient


def hypergradient(hypergrad: Callable, name: str, params: Params, autocast: Callable[[], object],
                  into_grad: bool = False, sync=None) -> Source:
    """``name``'s hypergradient, ``hypergrad(name, accumulate, seed)`` in the ``autocast``
    context; the loss is the top loss when a ``seed`` is given (the seed sees it), else
    None. With ``into_grad`` the one final backward accumulates into the cleared
    ``.grad`` (as ``loss.backward()`` lays gradients out), which is returned: for a
    pipeline whose stages act on ``.grad``. ``sync``: averaged across replicas during the
    final backward (:meth:`Hierarchy.hypergrad <mloc.runtime.grad.compose.Hierarchy.hypergrad>`;
    not with ``into_grad``)."""
    fp32 = autocast() is NULL_CONTEXT

    def compute(seed: Seed | None):
        if fp32:
            return hypergrad(name, into_grad, seed, sync)
        with autocast():
            return hypergrad(name, into_grad, seed, sync)

    def returned(seed: Seed | None) -> Params:
        grads = compute(seed)
        if grads is None:   # parameters with no path to the loss get zeros (marked absent)
            return tree.dense((None,) * len(params), params)
        return tree.dense(grads, params)

    def accumulated(seed: Seed | None) -> Params:
        for p in params:
            p.grad = None
        compute(seed)
        missing = [i for i, p in enumerate(params) if p.grad is None]
        for i in missing:
            params[i].grad = torch.zeros_like(params[i])
        return tree.marked([p.grad for p in params], missing)

    take = accumulated if into_grad else returned

    def gradient(seed: Seed | None = None) -> tuple[Params, Tensor | None]:
        if seed is None:
            return take(None), None
        losses = []

        def keep(loss: Tensor) -> Tensor:
            losses.append(loss)
            return seed(loss)
        grads = take(keep)
        return grads, (losses[0].detach() if losses else None)
    return gradient
