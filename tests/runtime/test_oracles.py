"""Every closed form used by the runtime tests, checked against central differences of an
outer objective whose inner problems are solved exactly (linear solves, or the exact
K-step map for unrolled methods).

Tolerance 1e-9 relative: central differences with one Richardson step have no truncation
error on the quadratic oracles and O(h⁴) ≈ 1e-12 on the ridge one; round-off is about
ε·|F|/h ≈ 1e-13 relative at h = 1e-3. Observed: 1e-13 to 2e-11.
"""

import pytest
import torch

from tests.runtime.oracles import F64, Quadratic, Ridge, central, krylov_basis, q_cg, \
    q_neumann, q_unrolled, rel
from tests.runtime.oracles_multi import Layered, Maml, Trilevel

TOL = 1e-9
SIZES = [(0, 5, 3, 4), (1, 8, 2, 6), (2, 3, 4, 2)]


@pytest.mark.parametrize("seed,d,m,p", SIZES)
def test_quadratic_exact(seed, d, m, p):
    q = Quadratic(seed, d, m, p)
    assert rel(q.exact(), central(lambda l: q.outer(q.solve(l), l), q.lam0)) < TOL


def unrolled_outer(q, steps, lr):
    """F_T(λ): T SGD steps on the inner loss from the fixed start w*(λ₀)."""
    start = q.solve(q.lam0)

    def f(lam):
        w = start
        for _ in range(steps):
            w = w - lr * (q.A @ w - q.B @ lam)
        return q.outer(w, lam)
    return f


@pytest.mark.parametrize("seed,d,m,p", SIZES)
@pytest.mark.parametrize("steps,lr", [(1, 0.1), (4, 0.2), (9, 0.05)])
def test_quadratic_unrolled_and_neumann_forms(seed, d, m, p, steps, lr):
    """ITD(T, η) from w*: q = A⁻¹(I−(I−ηA)^T)v; Neumann(K, α) is the same with T = K+1."""
    q = Quadratic(seed, d, m, p)
    want = central(unrolled_outer(q, steps, lr), q.lam0)
    assert rel(q.with_q(q_unrolled(q.A, q.v(), steps, lr)), want) < TOL
    assert rel(q.with_q(q_neumann(q.A, q.v(), steps - 1, lr)), want) < TOL


@pytest.mark.parametrize("seed,d,m,p", SIZES)
def test_quadratic_cg_form(seed, d, m, p):
    """CG(K) = Galerkin solution on the Krylov space (an algebraic characterisation: q lies
    in span V and its residual is orthogonal to V); CG(d) is the exact hypergradient."""
    q = Quadratic(seed, d, m, p)
    v = q.v()
    for k in range(1, d):
        sol, basis = q_cg(q.A, v, k), krylov_basis(q.A, v, k)
        assert torch.linalg.vector_norm(sol - basis @ (basis.T @ sol)) < 1e-12
        assert torch.linalg.vector_norm(basis.T @ (q.A @ sol - v)) < 1e-12
    assert rel(q.with_q(q_cg(q.A, v, d)), central(lambda l: q.outer(q.solve(l), l), q.lam0)) < TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_identity_and_diagonal_forms(seed):
    """finite_diff's ρλ + Bᵀv is exact for A = I; SAMA's ρλ + Bᵀ(s⊙v) for A = diag(1/s)."""
    s = 0.2 + torch.rand(5, generator=torch.Generator().manual_seed(seed), dtype=F64)
    for a, q_of in [(torch.eye(5, dtype=F64), lambda v: v), (torch.diag(1 / s), lambda v: s * v)]:
        q = Quadratic(seed, a=a)
        want = central(lambda l: q.outer(q.solve(l), l), q.lam0)
        assert rel(q.with_q(q_of(q.v())), want) < TOL


@pytest.mark.parametrize("seed,n,d", [(0, 30, 6), (1, 50, 4), (2, 20, 9)])
def test_ridge_forms(seed, n, d):
    r = Ridge(seed, n, d)
    assert rel(r.exact(), central(lambda l: r.outer(r.solve(l)), r.lam0)) < TOL
    start, h, steps, lr = r.solve(r.lam0), r.hessian(r.lam0), 5, 0.2

    def unrolled(lam):
        w = start.clone().requires_grad_(True)
        for _ in range(steps):
            w = w - lr * torch.autograd.grad(r.inner(w, lam), w, create_graph=True)[0]
        return r.outer(w)
    assert rel(r.with_q(q_unrolled(h, r.v(), steps, lr)), central(unrolled, r.lam0)) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dag", [False, True])
@pytest.mark.parametrize("feedback", [True, False])
def test_trilevel_forms(seed, dag, feedback):
    t = Trilevel(seed, dag=dag, feedback=feedback)
    assert rel(t.exact(), central(t.outer, t.lam0)) < TOL
    per_edge_is_exact = not feedback
    frozen = t.outer if per_edge_is_exact else t.frozen_outer
    assert rel(t.per_edge(), central(frozen, t.lam0)) < TOL
    if feedback:  # the two semantics really differ on these oracles
        assert rel(t.per_edge(), t.exact()) > 0.05


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dag", [False, True])
@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("semantics", ["per_edge", "exact"])
def test_trilevel_truncated_middle_forms(seed, dag, feedback, semantics):
    """neumann(K) at the middle = K+1 gradient steps of size α on the middle's map."""
    t = Trilevel(seed, dag=dag, feedback=feedback)
    q = q_neumann(t.reduced_hessian(semantics), t.r(), 4, 0.02)
    want = central(t.unrolled_outer(semantics, 5, 0.02), t.lam0)
    assert rel(t.with_q(q, semantics), want) < TOL


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dag", [False, True])
def test_trilevel_top_reading_the_bottom(seed, dag):
    t = Trilevel(seed, dag=dag, top_reads_w=True)
    assert rel(torch.func.grad(t.outer)(t.lam0), central(t.outer, t.lam0)) < TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_layered_outer(seed):
    net = Layered(seed)
    exact = torch.func.grad(net.outer)(net.lam0)  # autograd through the linear solves
    assert rel(exact, central(net.outer, net.lam0)) < TOL


@pytest.mark.parametrize("seed,d,steps", [(0, 4, 3), (1, 6, 1), (2, 3, 5)])
def test_maml_forms(seed, d, steps):
    m = Maml(seed, d, steps)
    assert rel(m.maml(), central(lambda t: m.val(m.adapted(t)), m.theta0)) < TOL
    assert rel(m.fomaml(), central(m.val, m.adapted(m.theta0))) < TOL
    assert rel(m.imaml(), central(lambda t: m.val(m.proximal(t)), m.theta0)) < TOL
