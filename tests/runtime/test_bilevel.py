"""Oracles Q and R: every BR-VJP method equals its own closed form (relative error 1e-10).

Float64 throughout. Autograd and the closed forms agree to ~1e-15; the bound leaves room
for the condition number of the small SPD systems (spectra in [1, 4]) and, for the finite
difference methods, for the O(ε_mach/ε) round-off of the central difference.
"""

import pytest
import torch

from mloc.runtime import adam, cg, finite_diff, first_order, itd, neumann, sama, sgd
from tests.runtime.oracles import F64, Quadratic, Ridge, q_cg, q_neumann, q_unrolled, rel
from tests.runtime.paths import hypergrad_paths

TOL = 1e-10
SIZES = [(0, 5, 3, 4), (1, 8, 2, 6), (2, 3, 4, 2)]
LR = 0.1  # the lower problem's SGD step size in Quadratic.program


def hypergrad(program, method, **kw):
    hier, lam = program(method, **kw)
    hier.hypergrad("lam")
    return lam.grad


def method_cases(h, v, d):
    """(method, its closed-form q) for a lower problem with Hessian h at its solution."""
    return [
        (itd(1), q_unrolled(h, v, 1, LR)),
        (itd(6), q_unrolled(h, v, 6, LR)),
        (itd(7, truncate=3), q_unrolled(h, v, 3, LR)),
        (itd(6, mode="recompute"), q_unrolled(h, v, 6, LR)),
        (itd(5, truncate=2, mode="recompute"), q_unrolled(h, v, 2, LR)),
        (itd(4, mode="forward"), q_unrolled(h, v, 4, LR)),
        (neumann(0, 0.2), q_neumann(h, v, 0, 0.2)),
        (neumann(5, 0.2), q_neumann(h, v, 5, 0.2)),
        (cg(1), q_cg(h, v, 1)),
        (cg(d - 1), q_cg(h, v, d - 1)),
        (cg(2, damping=0.3), q_cg(h, v, 2, damping=0.3)),
        (finite_diff(), v),
        (finite_diff(1e-3), v),
        (sama(), LR * v),
        (first_order(), 0 * v),
    ]


@pytest.mark.parametrize("seed,d,m,p", SIZES)
def test_quadratic_every_method_matches_its_closed_form(seed, d, m, p):
    q = Quadratic(seed, d, m, p)
    for method, q_want in method_cases(q.A, q.v(), d):
        got = hypergrad(q.program, method)
        assert rel(got, q.with_q(q_want)) < TOL, method


@pytest.mark.parametrize("seed,n,d", [(0, 30, 6), (1, 50, 4)])
def test_ridge_every_method_matches_its_closed_form(seed, n, d):
    r = Ridge(seed, n, d)
    h = r.hessian(r.lam0)
    for method, q_want in method_cases(h, r.v(), d):
        got = hypergrad(r.program, method, optimizer=sgd(LR))
        if isinstance(method, first_order):  # the outer loss does not read λ: nothing to add
            assert got is None
            continue
        assert rel(got, r.with_q(q_want)) < TOL, method


@pytest.mark.parametrize("seed,d,m,p", SIZES)
def test_quadratic_exact_methods(seed, d, m, p):
    """cg with K = d, itd run to convergence and forward-mode itd give the exact answer."""
    q = Quadratic(seed, d, m, p)
    exact = q.exact()
    assert rel(hypergrad(q.program, cg(d)), exact) < TOL
    # η = 1/4 on a spectrum in [1, 4]: contraction 3/4, (3/4)^120 ≈ 1e-15.
    assert rel(hypergrad(q.program, itd(120), optimizer=sgd(0.25)), exact) < TOL
    assert rel(hypergrad(q.program, itd(120, mode="forward"), optimizer=sgd(0.25)), exact) < TOL


@pytest.mark.parametrize("seed,n,d", [(0, 30, 6), (1, 50, 4)])
def test_ridge_exact_methods(seed, n, d):
    r = Ridge(seed, n, d)
    exact = r.exact()
    assert rel(hypergrad(r.program, cg(d)), exact) < TOL
    lmax = float(torch.linalg.eigvalsh(r.hessian(r.lam0))[-1])
    lmin = float(torch.linalg.eigvalsh(r.hessian(r.lam0))[0])
    steps = int(36 / (lmin / lmax)) + 1  # (1 - lmin/lmax)^steps < e^-36
    for mode in ("reverse", "forward"):
        got = hypergrad(r.program, itd(steps, mode=mode), optimizer=sgd(1 / lmax))
        assert rel(got, exact) < TOL, mode


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("opt", [sgd(0.05, momentum=0.9), sgd(0.05, momentum=0.5, nesterov=True),
                                 adam(0.05), sgd(0.1, weight_decay=0.1)])
def test_forward_and_recompute_equal_reverse(seed, opt):
    """Away from the solution and with stateful optimizers (momentum, Adam moments)."""
    q = Quadratic(seed, 4, 3, 3)
    results = []
    for mode in ("reverse", "forward", "recompute"):
        hier, lam = q.program(itd(5, mode=mode), optimizer=opt)
        w = hier.problems["w"]
        with torch.no_grad():
            w.params[0].add_(torch.linspace(-1, 1, 4, dtype=F64))
        hier.hypergrad("lam")
        results.append(lam.grad)
        if mode == "reverse":  # the fused two-level path against the general one
            assert rel(hypergrad_paths(hier, "lam")[0], lam.grad) < TOL
    assert rel(results[1], results[0]) < TOL
    assert rel(results[2], results[0]) < TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_sama_adam_matches_closed_form(seed):
    """SAMA with an Adam lower: ρλ + Bᵀ(s⊙v), s the derivative of Adam's next step."""
    q = Quadratic(seed, 5, 3, 4)
    opt = adam(0.01)
    hier, lam = q.program(sama(), optimizer=opt)
    gen = torch.Generator().manual_seed(seed)
    w = hier.problems["w"]
    mu, nu = torch.randn(5, generator=gen, dtype=F64), torch.rand(5, generator=gen, dtype=F64)
    w.state = w.state._replace(count=7, mu=(mu,), nu=(nu,))
    g = torch.zeros(5, dtype=F64)  # the gradient at the solution w*

    def step(g):
        return opt.update((g,), w.state, w.params)[0][0]
    s = -torch.autograd.functional.jacobian(step, g).diagonal()
    hier.hypergrad("lam")
    assert rel(lam.grad, q.with_q(s * q.v())) < TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_one_step_sama_with_sgd_equals_itd_one_step(seed):
    """One-step DARTS with ξ = η (SAMA with SGD) is ITD with one step."""
    q = Quadratic(seed, 6, 2, 3)
    assert rel(hypergrad(q.program, sama()), hypergrad(q.program, itd(1))) < TOL


@pytest.mark.parametrize("opt", [sgd, adam])
def test_itd_differentiates_a_learnable_learning_rate(opt):
    """HPO of the lower's step size: the upper's parameter is the lr tensor the lower's
    optimizer uses (no loss reads it); itd's hypergradient is d outer(θ_K)/d lr."""
    q = Quadratic(0, 4, 2, 3)
    lr = torch.tensor(0.05, dtype=F64, requires_grad=True)
    start = torch.zeros(4, dtype=F64)
    inner_loss = lambda w: 0.5 * w @ q.A @ w - (q.B @ q.lam0) @ w  # noqa: E731
    from mloc.runtime import Edge, Problem
    from tests.runtime.hand_built import hierarchy
    w = start.clone().requires_grad_(True)
    lower = Problem("w", (w,), lambda w: inner_loss(w[0]), ("w",), opt(lr))
    upper = Problem("lr", (lr,), lambda w: q.outer(w[0], q.lam0), ("w",))
    hierarchy([lower, upper], [Edge("lr", "w", itd(4))]).hypergrad("lr")

    def unrolled(step):
        o = opt(step)
        theta, state = (start,), o.init((start,))
        for _ in range(4):
            theta_leaf = theta[0].detach().requires_grad_(True)
            g = torch.autograd.grad(inner_loss(theta_leaf), theta_leaf)[0]
            updates, state = o.update((g,), state, theta)
            theta = (theta[0] + updates[0],)
        return q.outer(theta[0], q.lam0)
    h = 1e-6
    want = (unrolled(0.05 + h) - unrolled(0.05 - h)) / (2 * h)
    assert abs(float(lr.grad - want)) <= 1e-7 * abs(float(want))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cg_tolerance_stops_at_the_first_small_residual(seed):
    """cg(K, tol) = CG(k*) with k* the first step whose residual is ≤ tol·‖v‖; the later
    steps are masked on the device (q stays put) instead of breaking out on the host."""
    q = Quadratic(seed, 8, 3, 5)
    v = q.v()
    residual = [float(torch.linalg.vector_norm(v - q.A @ q_cg(q.A, v, k))) for k in range(1, 9)]
    tol = 1.0001 * residual[2] / float(torch.linalg.vector_norm(v))
    first = next(k for k, r in enumerate(residual, 1) if r <= tol * torch.linalg.vector_norm(v))
    assert first <= 3
    assert rel(hypergrad(q.program, cg(8, tol=tol)), q.with_q(q_cg(q.A, v, first))) < TOL
