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
from mloc.runtime.optim.ops import FUNCTIONAL, INPLACE
from mloc.runtime.base.tree import Params


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

    def update(self, grads, state, params):
        return step(FUNCTIONAL, self.hyper, self.decoupled, state, params, grads)

    def diag(self, grads, state, params):
        # d/dg of  lr/c1 · m / (sqrt(v/c2) + eps), with m, v the moments after g:
        #   lr/c1 · [ (1-b1)/D  -  m (1-b2) g / (c2 sqrt(v/c2) D²) ],  D = sqrt(v/c2) + eps.
        # Bias correction is kept: s is the exact derivative of the step actually taken.
        h = self.hyper
        b1, b2 = h.betas
        g, mu, nu = moments(FUNCTIONAL, h, self.decoupled, state, params, grads)
        c1, c2, _ = corrections(h, state.count)
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
        """:func:`step` in place: ``torch.optim.adam._single_tensor_adam``'s kernels
        (``decoupled_weight_decay`` for AdamW); the step count is a Python int
        (``torch.optim`` reads its step tensor back to the host: the same float)."""
        if not self.inplace:
            return super().commit(grads, state, params)
        return step(INPLACE, self.hyper, self.decoupled, state, params, grads)[1]

    def compiled_commit(self):
        """:func:`step` compiled (:meth:`_written`), its bias corrections computed on the host
        before each call (:func:`corrections`) and given to it in one float64 tensor: a
        power of a symbolic step count would be evaluated in every vector of the fused
        kernel, and a Python float given to a kernel as its scalar is a constant (a
        recompile per step). The moments are written in place, the count never enters."""
        from mloc.runtime.optim.compiled import CompiledCommit, Region, host_numbers
        region = Region(self._written, f"{type(self).__name__}_commit")

        def commit(grads, state, params):
            region(grads, state.mu, state.nu, params, host_numbers(corrections(self.hyper, state.count), params))
            return AdamState(state.count + 1, tuple(state.mu), tuple(state.nu))
        return CompiledCommit(commit, (region,))

    def _written(self, grads, mu, nu, params, numbers):
        """The compiled region: :func:`step` out of place (:data:`~.ops.FUNCTIONAL`, whose
        operations take tensors for numbers), with ``numbers`` the step's
        :func:`corrections` (so the state's count, 0 here, is not read); the parameters and
        the moments ``mu``, ``nu`` are overwritten."""
        state = AdamState(0, tuple(mu), tuple(nu))
        updates, new = step(FUNCTIONAL, self.hyper, self.decoupled, state, params, grads, tuple(numbers.unbind()))
        for p, u in zip(params, updates):
            p.add_(u)
        for old, value in zip(state.mu + state.nu, new.mu + new.nu):
            old.copy_(value)


def corrections(h: AdamHyper, count: int) -> tuple:
    """``(1−β₁ᵗ, 1−β₂ᵗ, √(1−β₂ᵗ))`` at step ``t = count + 1``: all that a step reads of
    the step count, host arithmetic (0-dim tensors where a schedule drives ``betas``)."""
    (b1, b2), t = h.betas, count + 1
    c2 = 1 - b2**t
    return 1 - b1**t, c2, c2**0.5


def moments(ops, h: AdamHyper, decoupled: bool, state: AdamState, params, grads):
    """``(g', m_t, v_t)`` in the algebra of :mod:`.ops`, ``g' = g + wd·θ`` for Adam (``g``
    for AdamW): the moments of :func:`step`, and what :meth:`Adam.diag` differentiates."""
    (b1, b2), wd = h.betas, h.weight_decay
    if not decoupled and not is_zero(wd):
        grads = ops.add(grads, params, wd)
    mu = ops.ema_lerp_(state.mu, grads, b1)             # β₁m + (1-β₁)g'
    nu = ops.ema_sq_(state.nu, grads, b2)               # β₂v + (1-β₂)g'²
    return grads, mu, nu


def step(ops, h: AdamHyper, decoupled: bool, state: AdamState, params, grads, c=None):
    """One Adam (AdamW) step in the algebra of :mod:`.ops` (the module docstring's
    equations): ``(updates, state)`` under :data:`~.ops.FUNCTIONAL`; under
    :data:`~.ops.INPLACE` the parameters and the moments are written. ``c``: the step's
    :func:`corrections` (None: computed here)."""
    lr, wd = h.lr, h.weight_decay
    c1, _, root_c2 = corrections(h, state.count) if c is None else c
    _, mu, nu = moments(ops, h, decoupled, state, params, grads)
    denom = ops.add_(ops.div(ops.sqrt(nu), root_c2), h.eps)        # √v_t/√c₂ + ε
    decay = (lr, wd) if decoupled and not is_zero(wd) else None      # AdamW: - η·wd·θ
    updates = ops.step_div(params, mu, denom, lr / c1, decay)        # - η/c₁ · m_t / denom
    return updates, AdamState(state.count + 1, tuple(mu), tuple(nu))


@takes(AdamHyper)
def adam(hyper: AdamHyper) -> Adam:
    """Adam with L2 weight decay added to the gradient (see :class:`Adam`)."""
    return Adam(hyper, decoupled=False)


@takes(AdamWHyper)
def adamw(hyper: AdamWHyper) -> Adam:
    """AdamW: Adam with decoupled weight decay ``Δθ -= η·wd·θ`` (see :class:`Adam`)."""
    return Adam(hyper, decoupled=True)
