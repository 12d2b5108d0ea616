"""finite_diff's ``xi``: DARTS' unrolled step size (Liu et al., ICLR 2019, eq. 7–8).

DARTS differentiates the upper's loss through one step ``w' = w − ξ ∇_w L(w, λ)``; at the
lower's solution ``w*`` (where that step goes nowhere) its hypergradient is
``∇_λ F − ξ ∇²_{λw} L ∇_w F``, i.e. the BR-VJP with ``q = ξ v``. Checked in float64 against

- the closed form of oracles Q and R (shared/reference/hypergradients.md): ``ρλ + Bᵀ(ξv)``
  and ``−e^λ ⊙ w* ⊙ (ξv)``, where the central difference is exact (the lower's gradient in
  λ is linear in w on Q, quadratic on R, so the quotient has no truncation error): 1e-10,
  the bound of tests/runtime/test_bilevel.py, round-off of the quotient being ~1e-13;
- an independent reference, central differences of the one-step unrolled objective
  ``F(w* − ξ(Aw* − Bλ), λ)`` in λ: 1e-9, the bound of tests/runtime/test_oracles.py;
- ``sama`` over SGD, whose ``q = s ⊙ v`` with ``s = η``: with ``ξ = η`` the same numbers,
  bit for bit (the same products ``η · v``, then the same code).
"""

import pytest
import torch

from mloc.runtime import finite_diff, sama, sgd
from tests.runtime.oracles import Quadratic, Ridge, central, rel
from tests.runtime.test_finite import general, program

SIZES = [(0, 5, 3, 4), (1, 8, 2, 6), (2, 3, 4, 2)]
XIS = [0.05, 0.3, 2.5]


def hypergrad(prog, method, **kw):
    hier, lam = prog(method, **kw)
    hier.hypergrad("lam")
    return lam.grad


def one_step_outer(q, xi):
    """DARTS' objective on oracle Q: F(w', λ) with w' = w* − ξ ∇_w L(w*, λ), w* = w*(λ₀) fixed."""
    start = q.solve(q.lam0)
    return lambda lam: q.outer(start - xi * (q.A @ start - q.B @ lam), lam)


@pytest.mark.parametrize("seed,d,m,p", SIZES)
@pytest.mark.parametrize("xi", XIS)
def test_quadratic_xi_is_darts_one_step_hypergradient(seed, d, m, p, xi):
    q = Quadratic(seed, d, m, p)
    got = hypergrad(q.program, finite_diff(xi=xi))
    assert rel(got, q.with_q(xi * q.v())) < 1e-10
    assert rel(got, central(one_step_outer(q, xi), q.lam0)) < 1e-9
    assert rel(got, q.with_q(q.v())) > 1e-2          # ξ really changed the answer


@pytest.mark.parametrize("seed,n,d", [(0, 30, 6), (1, 50, 4)])
@pytest.mark.parametrize("xi", XIS)
def test_ridge_xi_scales_the_mixed_term(seed, n, d, xi):
    r = Ridge(seed, n, d)
    got = hypergrad(r.program, finite_diff(xi=xi), optimizer=sgd(0.2))
    assert rel(got, r.with_q(xi * r.v())) < 1e-10


def test_xi_one_is_the_default_bit_for_bit():
    q = Quadratic(0)
    assert torch.equal(hypergrad(q.program, finite_diff(xi=1.0)), hypergrad(q.program, finite_diff()))


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "general"])
def test_xi_the_sgd_rate_is_sama_bit_for_bit(bound):
    """Over SGD(η, momentum 0.9, no dampening) SAMA's ``s`` is η on every step, so
    ``finite_diff(xi=η)`` writes the same bits as ``sama`` (both paths, 3 lower steps,
    BatchNorm buffers guarded); ``xi = 1`` does not."""
    lr, grads = 0.1, {}
    for name, method in [("sama", sama()), ("xi", finite_diff(xi=lr)), ("one", finite_diff())]:
        hier, net, logits = program(method, optimizer=sgd(lr, momentum=0.9))
        lower, got = hier.problems["net"], []
        for _ in range(3):
            logits.grad = None
            hier.hypergrad("weights") if bound else general(hier, "weights")
            got.append(logits.grad)
            net.zero_grad()
            lower.loss(lower.params, (logits,)).backward(inputs=lower.params)
            lower.step()
        grads[name] = got
    assert all(torch.count_nonzero(g) > 0 for g in grads["xi"])
    assert all(torch.equal(a, b) for a, b in zip(grads["xi"], grads["sama"]))
    assert not torch.allclose(grads["one"][0], grads["sama"][0])
