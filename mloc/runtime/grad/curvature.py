"""The curvature of a lower problem's loss in its own parameters, at the current state: is
the lower Hessian H = ∇²_θ L positive definite there?

Every implicit hypergradient solves H v = b (the implicit function theorem at a minimum,
where H ≻ 0); conjugate gradients in particular assume it. When H has a negative
eigenvalue the lower problem is not at a strict local minimum (a non-convex loss, or a
state far from a solution), and "CG to convergence" is no reference: on an indefinite
system CG can diverge or converge to anything. `mloc hypergrad --check` reports this.

For d ≤ `full` parameters H is built from d Hessian-vector products and its spectrum
computed exactly (`eigvalsh`, in the state's dtype). Above that, two power iterations
(Pearlmutter's HVP, `iters` each, from a seeded random start): one for the dominant
eigenvalue λ₁, one on λ₁·I − H for the bottom of the spectrum. The reported λ_min is then
the Rayleigh quotient vᵀHv/vᵀv of the direction found: an upper bound on the true λ_min,
and, when negative, a certificate of negative curvature along a probed direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mloc.runtime.base import tree
from mloc.runtime.grad.buffers import buffers_of, frozen


@dataclass(frozen=True)
class Curvature:
    """`exact`: the whole spectrum was computed (else λ_min is a probed Rayleigh quotient)."""

    problem: str
    size: int
    lam_min: float
    lam_max: float
    exact: bool

    def indefinite(self, rtol: float) -> bool:
        """λ_min below −rtol·|λ_max|: negative curvature beyond rounding."""
        return self.lam_min < -rtol * max(abs(self.lam_max), abs(self.lam_min), 1e-300)


def lower_curvature(program, name: str, *, full: int = 400, iters: int = 50, seed: int = 0) -> Curvature:
    """The curvature of `name`'s loss at `program`'s current state and batch."""
    # Every Hessian-vector product runs inside `frozen`: BatchNorm's forward updates its
    # running statistics in place and its backward node saves them, so restoring them
    # (an in-place copy) while the gradient's graph is still differentiated would fail
    # autograd's version check ("modified by an inplace operation"); restored once, after.
    with frozen(buffers_of(program.modules.values())):
        return _curvature(program, name, full, iters, seed)


def _curvature(program, name: str, full: int, iters: int, seed: int) -> Curvature:
    lv = program.live[name]
    theta = tuple(lv.problem.params)
    args = [program.live[r].problem.params for r in lv.problem.reads]
    loss = lv.problem.loss(*args)
    grads = tree.dense(torch.autograd.grad(loss, theta, create_graph=True, allow_unused=True), theta)
    flat = torch.cat([g.reshape(-1) for g in grads])
    d = flat.numel()

    def hvp(v: torch.Tensor) -> torch.Tensor:
        if not flat.requires_grad:      # a loss linear in θ (or not reaching it): H = 0
            return torch.zeros_like(v)
        out = torch.autograd.grad(flat, theta, grad_outputs=v, retain_graph=True, allow_unused=True)
        return torch.cat([(o if o is not None else torch.zeros_like(t)).reshape(-1) for o, t in zip(out, theta)])

    if d <= full:
        eye = torch.eye(d, dtype=flat.dtype, device=flat.device)
        h = torch.stack([hvp(eye[i]) for i in range(d)])
        lam = torch.linalg.eigvalsh((h + h.T) / 2)
        return Curvature(name, d, float(lam[0]), float(lam[-1]), True)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    start = torch.randn(d, generator=gen, dtype=flat.dtype).to(flat.device)
    top, _ = _power(hvp, start, iters, shift=0.0)
    shift = abs(top)
    _, v = _power(hvp, start, iters, shift=shift)          # the top of shift·I − H: H's bottom
    lam_min = float(v @ hvp(v) / (v @ v))
    return Curvature(name, d, lam_min, top, False)


def _power(hvp, start: torch.Tensor, iters: int, shift: float) -> tuple[float, torch.Tensor]:
    """Power iteration on shift·I − H (H for shift 0): (H's Rayleigh quotient, the vector)."""
    v = start / start.norm()
    for _ in range(iters):
        hv = hvp(v)
        w = shift * v - hv if shift else hv
        n = w.norm()
        if not torch.isfinite(n) or n == 0:
            break
        v = w / n
    return float(v @ hvp(v)), v
