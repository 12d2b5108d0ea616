"""Implicit differentiation (AID): solve ``H q = v`` approximately, then one mixed VJP.

Both methods use only Hessian-vector products (Pearlmutter, "Fast exact multiplication
by the Hessian", 1994): one backward through the cached gradient ``g = ∇_θ L``, so a
BR-VJP costs about ``2G + K·Hv`` and never forms ``H``. Both are exact only at a
stationary point ``θ = θ*`` (the implicit function theorem); that is the assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mloc.runtime.base import tree


@dataclass(frozen=True)
class _Implicit:
    def prepare(self, op):
        return op.theta

    def vjp(self, op, v, create_graph: bool = False):
        return op.mixed(self.solve(op, v, create_graph), create_graph)


@dataclass(frozen=True)
class cg(_Implicit):
    r"""Conjugate gradients on ``(H + δI) q = v`` for ``iters`` steps (Hestenes & Stiefel 1952).

    .. math::
        x_0 = 0,\ r_0 = p_0 = v,\quad \alpha_k = \frac{r_k^\top r_k}{p_k^\top (H+\delta I) p_k},\
        x_{k+1} = x_k + \alpha_k p_k,\ r_{k+1} = r_k - \alpha_k (H+\delta I) p_k,\
        p_{k+1} = r_{k+1} + \beta_k p_k,\ \beta_k = \frac{r_{k+1}^\top r_{k+1}}{r_k^\top r_k}

    The direction update uses the **new** residual (Betty issue #15 used the old one), and
    the damping ``δ`` enters the operator once, so both ``α`` and the residual see it: the
    iteration converges to ``(H+δI)⁻¹v``, never to a rescaled solution. After ``K`` steps
    ``q = V(Vᵀ(H+δI)V)⁻¹Vᵀv`` with ``V`` spanning the Krylov space ``{v, …, H^{K-1}v}``;
    with ``K = d`` and ``H ≻ 0`` it is exact. Rajeswaran et al., "Meta-Learning with
    Implicit Gradients" (iMAML), NeurIPS 2019. Once ``‖r‖ ≤ tol·‖v‖`` the remaining steps
    are masked out on the device (no host synchronisation per step).
    """

    iters: int = 10
    tol: float = 1e-10
    damping: float = 0.0

    def solve(self, op, v, create_graph=False):
        x = tree.zeros(v)
        r = p = v
        rr = tree.dot(r, r)
        floor = self.tol**2 * rr
        for _ in range(self.iters):
            hp = op.hvp(p, create_graph)
            if self.damping:
                hp = tree.axpy(self.damping, p, hp)
            active = rr > floor  # masked, not branched: no nan (0/0) even in double backward
            alpha = torch.where(active, rr, 0.0) / torch.where(active, tree.dot(p, hp), 1.0)
            x = tree.axpy(alpha, p, x)
            r = tree.axpy(-alpha, hp, r)
            rr_new = tree.dot(r, r)
            beta = torch.where(active, rr_new, 0.0) / torch.where(active, rr, 1.0)
            p = tree.axpy(beta, p, r)
            rr = rr_new
        return x


@dataclass(frozen=True)
class neumann(_Implicit):
    r"""Truncated Neumann series ``q = α Σ_{j=0}^{K} (I - αH)^j v`` (``K = iters``).

    Equals ``H⁻¹(I - (I-αH)^{K+1}) v``; converges for ``0 < α < 2/λ_max(H)``. At ``θ*`` it
    is exactly ITD with ``K+1`` SGD steps of size ``α`` started at ``θ*``. Lorraine et al.,
    "Optimizing Millions of Hyperparameters by Implicit Differentiation", AISTATS 2020.
    """

    iters: int = 5
    alpha: float = 0.1

    def solve(self, op, v, create_graph=False):
        return tree.scale(self.alpha, self._series(op, v, create_graph))

    def vjp(self, op, v, create_graph: bool = False):
        # the BR-VJP's cotangent -q = -α·Σ: one scaling instead of scaling, then negating
        return op.mixed_negated(tree.scale(-self.alpha, self._series(op, v, create_graph)), create_graph)

    def _series(self, op, v, create_graph):
        """``Σ_{j=0}^{K} (I - αH)^j v``."""
        p = acc = v
        for _ in range(self.iters):
            p = tree.axpy(-self.alpha, op.hvp(p, create_graph), p)
            acc = tree.add(acc, p)
        return acc
