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
from mloc.runtime.tree import Params


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
        h = self.hyper
        lr, mu, wd = h.lr, h.momentum, h.weight_decay
        if not is_zero(wd):
            grads = tuple(g + wd * p for g, p in zip(grads, params))
        if not self.has_momentum:
            return tuple(-lr * g for g in grads), SGDState(state.count + 1, ())
        if state.count == 0:
            buf = grads
        else:
            buf = tuple(mu * b + (1 - h.dampening) * g for b, g in zip(state.momentum, grads))
        direction = tuple(g + mu * b for g, b in zip(grads, buf)) if h.nesterov else buf
        return tuple(-lr * d for d in direction), SGDState(state.count + 1, buf)

    def diag(self, grads, state, params):
        h, c = self.hyper, 1.0
        if self.has_momentum:
            c = 1.0 if state.count == 0 else 1 - h.dampening
            c = 1 + h.momentum * c if h.nesterov else c
        return (h.lr * c,) * len(params)

    def committed(self, state):
        return state.momentum

    def commit(self, grads, state, params):
        """``torch.optim.sgd._single_tensor_sgd``, operation for operation (so a committed
        run is bit-identical to ``torch.optim.SGD(foreach=False)``)."""
        if not self.inplace:
            return super().commit(grads, state, params)
        h = self.hyper
        lr, mu, wd, has_momentum, nesterov = h.lr, h.momentum, h.weight_decay, self.has_momentum, h.nesterov
        damped = 1 - h.dampening
        first, bufs = state.count == 0, []
        for i, (p, g) in enumerate(zip(params, grads)):
            if wd != 0:
                g = g.add(p, alpha=wd)
            if has_momentum:
                if first:
                    buf = g.detach().clone()
                else:
                    buf = state.momentum[i]
                    buf.mul_(mu).add_(g, alpha=damped)
                bufs.append(buf)
                g = g.add(buf, alpha=mu) if nesterov else buf
            p.add_(g, alpha=-lr)
        return SGDState(state.count + 1, tuple(bufs))


@takes(SGDHyper)
def sgd(hyper: SGDHyper) -> SGD:
    """SGD with optional (Nesterov) momentum and L2 weight decay (see :class:`SGD`)."""
    return SGD(hyper)
