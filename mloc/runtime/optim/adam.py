r"""Adam and AdamW (``torch.optim.Adam`` / ``AdamW``).

.. math::
    m_t = \beta_1 m_{t-1} + (1-\beta_1) g,\ v_t = \beta_2 v_{t-1} + (1-\beta_2) g^2,\
    \Delta\theta = -\frac{\eta}{1-\beta_1^t}\,\frac{m_t}{\sqrt{v_t/(1-\beta_2^t)} + \epsilon}

Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015. AdamW decouples the
weight decay, ``Δθ -= η·wd·θ`` (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", ICLR 2019); Adam adds ``wd·θ`` to the gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mloc.shared.hyper import AdamHyper, AdamWHyper
from mloc.runtime.optim.base import Optimizer, is_zero, numbers, takes
from mloc.runtime.tree import Params


class AdamState(NamedTuple):
    count: int
    mu: Params
    nu: Params


class Adam(Optimizer):
    """See the module docstring. ``diag`` is the exact elementwise derivative of the step
    with respect to ``g`` (bias correction and ``ε`` included); with ``ε = 0`` it is SAMA's
    ``η√c₂/c₁ · [(1-β₁)β₂ v_{t-1} - β₁(1-β₂) g m_{t-1}] / v_t^{3/2}``. The decoupled decay
    does not read ``g``, so AdamW's ``diag`` is Adam's. A scheduled ``betas`` (OneCycleLR's
    momentum cycling) is used as ``torch.optim.Adam`` uses it: the current ``β₁`` in the
    moment and in the bias correction ``1 − β₁ᵗ``."""

    def __init__(self, hyper: AdamHyper, decoupled: bool = False):
        super().__init__(hyper)
        self.decoupled = decoupled
        self.inplace = numbers(hyper.lr, *hyper.betas, hyper.eps, hyper.weight_decay)

    def init(self, params):
        zeros = lambda: tuple(torch.zeros_like(p) for p in params)  # noqa: E731
        return AdamState(0, zeros(), zeros())

    def _moments(self, grads, state, params):
        h = self.hyper
        (b1, b2), wd = h.betas, h.weight_decay
        if not self.decoupled and not is_zero(wd):
            grads = tuple(g + wd * p for g, p in zip(grads, params))
        mu = tuple(m + (1 - b1) * (g - m) for m, g in zip(state.mu, grads))
        nu = tuple(b2 * v + (1 - b2) * g * g for v, g in zip(state.nu, grads))
        t = state.count + 1
        return grads, mu, nu, 1 - b1**t, 1 - b2**t

    def update(self, grads, state, params):
        h = self.hyper
        lr, wd = h.lr, h.weight_decay
        _, mu, nu, c1, c2 = self._moments(grads, state, params)
        step, root_c2 = lr / c1, c2**0.5
        upd = tuple(-step * m / (torch.sqrt(v) / root_c2 + h.eps) for m, v in zip(mu, nu))
        if self.decoupled and not is_zero(wd):
            upd = tuple(u - lr * wd * p for u, p in zip(upd, params))
        return upd, AdamState(state.count + 1, mu, nu)

    def diag(self, grads, state, params):
        # d/dg of  lr/c1 · m / (sqrt(v/c2) + eps), with m, v the moments after g:
        #   lr/c1 · [ (1-b1)/D  -  m (1-b2) g / (c2 sqrt(v/c2) D²) ],  D = sqrt(v/c2) + eps.
        # Bias correction is kept: s is the exact derivative of the step actually taken.
        h = self.hyper
        b1, b2 = h.betas
        g, mu, nu, c1, c2 = self._moments(grads, state, params)
        out = []
        for gi, m, v in zip(g, mu, nu):
            root = torch.sqrt(v / c2)
            d = root + h.eps
            curv = torch.where(root > 0, m * (1 - b2) * gi / (c2 * root * d * d), 0.0)
            out.append(h.lr / c1 * ((1 - b1) / d - curv))
        return tuple(out)

    def committed(self, state):
        return state.mu + state.nu

    def commit(self, grads, state, params):
        """``torch.optim.adam._single_tensor_adam`` (``decoupled_weight_decay`` for AdamW),
        operation for operation; the step count is a Python int (``torch.optim`` reads its
        step tensor back to the host: the same float)."""
        if not self.inplace:
            return super().commit(grads, state, params)
        h = self.hyper
        lr, (b1, b2), wd, eps = h.lr, h.betas, h.weight_decay, h.eps
        t = state.count + 1
        step_size = lr / (1 - b1**t)
        root_c2 = (1 - b2**t) ** 0.5
        for p, g, m, v in zip(params, grads, state.mu, state.nu):
            if wd != 0:
                if self.decoupled:
                    p.mul_(1 - lr * wd)
                else:
                    g = g.add(p, alpha=wd)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / root_c2).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)
        return AdamState(t, state.mu, state.nu)


@takes(AdamHyper)
def adam(hyper: AdamHyper) -> Adam:
    """Adam with L2 weight decay added to the gradient (see :class:`Adam`)."""
    return Adam(hyper, decoupled=False)


@takes(AdamWHyper)
def adamw(hyper: AdamWHyper) -> Adam:
    """AdamW: Adam with decoupled weight decay ``Δθ -= η·wd·θ`` (see :class:`Adam`)."""
    return Adam(hyper, decoupled=True)
