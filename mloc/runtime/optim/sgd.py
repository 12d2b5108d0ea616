r"""Stochastic gradient descent with heavy-ball or Nesterov momentum (``torch.optim.SGD``).

.. math::
    g' = g + \text{wd}\,\theta,\quad
    b_t = \mu b_{t-1} + (1-\tau) g' \ (b_1 = g'),\quad
    \Delta\theta = -\eta\,(g' + \mu b_t \text{ if nesterov else } b_t)

Polyak (1964); Sutskever et al., "On the importance of initialization and momentum in deep
learning", ICML 2013.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mloc.shared.hyper import SGDHyper
from mloc.runtime.optim.base import Optimizer, is_zero, numbers, takes
from mloc.runtime.optim.ops import FUNCTIONAL, INPLACE
from mloc.runtime.base.tree import Params


class SGDState(NamedTuple):
    count: int          # steps taken (a Python int: no host sync to read it)
    momentum: Params    # one buffer per parameter, () without momentum


class SGD(Optimizer):
    """See the module docstring. ``diag`` is ``η`` times ``1`` (no momentum), ``(1-τ)``
    after the first step (``1`` on it), plus ``μ`` times that for Nesterov: the learning
    rate is always kept (Betty drops it for SGD, which changes the meta step scale
    whenever the base optimizer changes)."""

    diag_uses_grad = False

    def __init__(self, hyper: SGDHyper):
        super().__init__(hyper)
        h = hyper
        self.has_momentum = not is_zero(h.momentum)
        if h.nesterov and (not self.has_momentum or not is_zero(h.dampening)):
            raise ValueError("nesterov momentum requires momentum > 0 and dampening = 0")
        self.inplace = numbers(h.lr, h.momentum, h.weight_decay, h.dampening)

    def _driven(self, keys):
        # a scheduled momentum is live even where it was built 0: torch.optim.SGD with
        # CyclicLR's default momentum cycling steps with momentum too
        self.has_momentum = self.has_momentum or "momentum" in keys

    def init(self, params):
        buf = tuple(torch.zeros_like(p) for p in params) if self.has_momentum else ()
        return SGDState(0, buf)

    def update(self, grads, state, params):
        return step(FUNCTIONAL, self.hyper, self.has_momentum, state, params, grads)

    def diag(self, grads, state, params):
        h, c = self.hyper, 1.0
        if self.has_momentum:
            c = 1.0 if state.count == 0 else 1 - h.dampening
            c = 1 + h.momentum * c if h.nesterov else c
        return (h.lr * c,) * len(params)

    def committed(self, state):
        return state.momentum

    def commit(self, grads, state, params):
        """:func:`step` in place: ``torch.optim.sgd._single_tensor_sgd``'s kernels (so a
        committed run is bit-identical to ``torch.optim.SGD(foreach=False)``)."""
        if not self.inplace:
            return super().commit(grads, state, params)
        return step(INPLACE, self.hyper, self.has_momentum, state, params, grads)[1]


def step(ops, h: SGDHyper, has_momentum: bool, state: SGDState, params, grads):
    """One SGD step in the algebra of :mod:`.ops` (the module docstring's equations):
    ``(updates, state)`` under :data:`~.ops.FUNCTIONAL`; under :data:`~.ops.INPLACE` the
    parameters and momentum buffers are written (the first step's buffer is a copy of
    ``g'``)."""
    lr, mu, wd = h.lr, h.momentum, h.weight_decay
    if not is_zero(wd):
        grads = ops.add(grads, params, wd)                          # g' = g + wd·θ
    if not has_momentum:
        return ops.step(params, grads, lr), SGDState(state.count + 1, ())
    if state.count == 0:
        buf = ops.copy(grads)                                       # b₁ = g'
    else:
        buf = ops.momentum_(state.momentum, grads, mu, h.dampening)  # b = μb + (1-τ)g'
    direction = ops.add(grads, buf, mu) if h.nesterov else buf     # g' + μb, or b
    return ops.step(params, direction, lr), SGDState(state.count + 1, tuple(buf))


@takes(SGDHyper)
def sgd(hyper: SGDHyper) -> SGD:
    """SGD with optional (Nesterov) momentum and L2 weight decay (see :class:`SGD`)."""
    return SGD(hyper)
