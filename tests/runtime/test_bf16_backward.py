"""Backward passes run outside autocast (``mloc.runtime.base.precision.autocast_off``).

Autocast is meant to wrap forwards only; on the CPU a backward called inside an autocast
region runs its matrix products in bfloat16 even where the forward ran in float32. The
finite-difference methods divide such an error by ``2ε``: a bf16 step's SAMA hypergradient
was 31 % away from the float32 one at ``eps = 0.01`` (2.5 % at 0.1) while the forwards it
differentiates ran in float32 as documented. Now the step's hypergradient differs from
float32's by what the bf16 forwards of the upper's loss cost (its gradient ``v`` and the
direct term, each within a few ``u = 2⁻⁸``), independent of ``eps``.

The lower loss that ``cg`` and ``neumann`` linearize (``LowerOp.grad``: every ``H p`` and the
mixed ``J_xᵀ q``) is evaluated with autocast off too. A solver applies ``H`` many times and
its error grows with ``H``'s condition number: with a bf16 linearization ``cg(10)``'s
hypergradient was 4.8 × its own size away from float32's (``cg(20)`` 1.4 ×, ``neumann(10)``
5.5e-3); with a float32 one, 1.6e-2 (6.0e-2, 7.0e-4), what the bf16 forward of the upper's
loss (``v``) costs once ``H⁻¹`` is applied to it."""

from __future__ import annotations

import pytest
import torch

import mloc
from mloc.runtime.base.precision import autocast_off
from tests.conftest import ROOT

PROGRAM = ROOT / "tests" / "runtime_loop" / "fsdp_hg.mlo"
U = 2.0 ** -8       # bfloat16's unit roundoff


def test_a_backward_under_autocast_off_is_the_float32_one_bitwise():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g, requires_grad=True)
    x = torch.randn(32, 64, generator=g)

    def grad(context):
        loss = torch.tanh(x @ w.T).square().sum()      # a float32 forward
        with torch.autocast("cpu", dtype=torch.bfloat16), context():
            return torch.autograd.grad(loss, w)[0]
    want = torch.autograd.grad(torch.tanh(x @ w.T).square().sum(), w)[0]
    assert torch.equal(grad(autocast_off), want)
    assert not torch.equal(grad(torch.enable_grad), want)     # what it guards against


def test_a_lower_linearized_under_autocast_is_the_float32_one_bitwise():
    """``H p`` and ``g`` of a lower taken inside a bf16 autocast region equal those taken
    outside it, bit for bit: no part of the linearization runs in bfloat16."""
    from mloc.runtime.grad.problem import LowerOp, Problem
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 32, generator=g, requires_grad=True)
    lam = torch.randn(16, generator=g, requires_grad=True)
    x = torch.randn(64, 32, generator=g)

    def loss(ws, lams):
        (w, ), (lam, ) = ws, lams
        return (torch.sigmoid(lam)[:, None] * torch.tanh(x @ w.T).T).square().mean()
    problem = Problem("w", (w,), loss, ("w", "lam"))
    p = (torch.randn(16, 32, generator=g),)

    def products(context):
        with context():
            op = LowerOp(problem, [(w,), (lam,)])
            return op.grad()[0].detach(), op.hvp(p)[0]
    want = products(torch.enable_grad)
    got = products(lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _step_hypergradient(precision: str, method: str) -> torch.Tensor:
    session = mloc.load(PROGRAM, precision=precision, set=[f"weights->net.hypergrad={method}"])
    session.hypergradients()                   # draws the batches
    grads, _ = session.program._source("weights")(None)
    return torch.cat([t.detach().float().reshape(-1) for t in grads])


@pytest.mark.parametrize("method", ["sama(eps=0.01)", "finite_diff(eps=0.01)", "sama(eps=0.1)"])
def test_a_bf16_steps_finite_difference_hypergradient_is_float32s_within_bf16s_forwards(method):
    fp32, bf16 = _step_hypergradient("fp32", method), _step_hypergradient("bf16", method)
    err = float((bf16 - fp32).norm() / fp32.norm())
    assert err <= 4 * U, err        # measured 0.0019 (sama and finite_diff); 0.31 before


@pytest.mark.parametrize("method, bound", [("neumann(iters=10)", 4 * U), ("cg(iters=10)", 0.05)])
def test_a_bf16_steps_implicit_hypergradient_is_float32s_within_what_v_costs(method, bound):
    """neumann: within ``4u`` as the finite differences. cg(10): its float32 solve is itself
    1.3e-4 from float64's (2000 × float32's ``u``: this lower's ``H`` is ill-conditioned),
    and the bf16 ``v`` it is given moves it by 1.6e-2 (``4.1 u``); 0.05 keeps a margin of 3
    and is two orders below the 4.8 a bf16 linearization gave."""
    fp32, bf16 = _step_hypergradient("fp32", method), _step_hypergradient("bf16", method)
    err = float((bf16 - fp32).norm() / fp32.norm())
    assert err <= bound, err        # measured 7.0e-4 (neumann), 1.6e-2 (cg); 5.5e-3, 4.8 before
