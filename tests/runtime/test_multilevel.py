"""Above two levels: oracles T and D under both semantics, adjoint accumulation against
path enumeration, and a 4-level many-path DAG where each BR-VJP runs once per update.

Tolerance 1e-10 relative in float64 (observed ≤ 4e-15): every lower uses cg with K equal
to its dimension, exact on these SPD quadratics; the `exact` semantics also runs cg on
the middle level's reduced Hessian (A₂ + GᵀG), each of its products a nested solve below.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mloc.runtime import Edge, Hierarchy, Problem, finite_diff, itd, neumann, sgd
from tests.runtime.hand_built import hierarchy
from tests.runtime.oracles import q_neumann, rel
from tests.runtime.paths import hypergrad_paths
from tests.runtime.oracles_multi import Layered, Trilevel

TOL = 1e-10


@dataclass(eq=False)
class Counted:
    """A method wrapper that records which lower each BR-VJP application was for."""

    inner: Any
    calls: list

    def prepare(self, op):
        return self.inner.prepare(op)

    def vjp(self, op, v, create_graph=False):
        self.calls.append(op.problem.name)
        return self.inner.vjp(op, v, create_graph)


def run(program, semantics, top="lam"):
    calls = []
    hier, lam = program(semantics, wrap=lambda m: Counted(m, calls))
    backwards = []
    lam.register_post_accumulate_grad_hook(lambda p: backwards.append(1))
    hier.hypergrad(top)
    return hier, lam.grad, calls, len(backwards)


CASES = [(seed, dag, fb) for seed in (0, 1, 2) for dag in (False, True) for fb in (True, False)]


@pytest.mark.parametrize("seed,dag,feedback", CASES)
def test_trilevel_semantics_match_closed_forms(seed, dag, feedback):
    t = Trilevel(seed, dag=dag, feedback=feedback)
    _, exact, _, n_exact = run(t.program, "exact")
    _, per_edge, _, n_per_edge = run(t.program, "per_edge")
    assert rel(exact, t.exact()) < TOL
    assert rel(per_edge, t.per_edge()) < TOL
    assert n_exact == n_per_edge == 1  # one final backward writes .grad


@pytest.mark.parametrize("seed,dag,feedback", CASES)
@pytest.mark.parametrize("semantics", ["per_edge", "exact"])
def test_truncated_middle_solver_sees_the_right_hessian(seed, dag, feedback, semantics):
    """neumann(K) at the middle: q = H⁻¹(I−(I−αH)^{K+1})r with H the reduced Hessian
    A₂ + GᵀG under `exact` (each product a nested solve below) and A₂ + E₂ᵀE₂ per edge."""
    t = Trilevel(seed, dag=dag, feedback=feedback)
    hier, lam = t.program(semantics, middle=neumann(4, 0.02))
    hier.hypergrad("lam")
    q = q_neumann(t.reduced_hessian(semantics), t.r(), 4, 0.02)
    assert rel(lam.grad, t.with_q(q, semantics)) < TOL


@pytest.mark.parametrize("seed,dag,feedback", CASES)
@pytest.mark.parametrize("semantics", ["per_edge", "exact"])
def test_accumulation_equals_path_enumeration(seed, dag, feedback, semantics):
    t = Trilevel(seed, dag=dag, feedback=feedback)
    _, accumulated, _, _ = run(t.program, semantics)
    hier, _ = t.program(semantics)
    assert rel(hypergrad_paths(hier, "lam")[0], accumulated) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("semantics", ["per_edge", "exact"])
def test_many_paths_each_brvjp_applied_once(seed, semantics):
    net = Layered(seed)
    hier, accumulated, calls, n_backward = run(net.program, semantics)
    lowers = [n for level in net.levels[1:] for n in level]
    assert Counter(calls) == Counter(lowers)  # 9 BR-VJPs: one per lower problem
    assert n_backward == 1
    exact = torch.func.grad(net.outer)(net.lam0)  # autograd through the exact linear solves
    assert rel(accumulated, exact) < TOL

    path_calls = []
    hier, _ = net.program(semantics, wrap=lambda m: Counted(m, path_calls))
    by_paths = hypergrad_paths(hier, "lam")[0]
    assert rel(by_paths, accumulated) < TOL
    # Paths from λ to each bottom problem: 3·3 through the levels plus 3 skip paths; the
    # reference re-applies the BR-VJPs of every path prefix: 3 · (1 + 3 · (1 + 3)) = 39.
    assert len(path_calls) == 39


def test_exact_semantics_rejects_unrolled_and_non_differentiable_lowers():
    t = Trilevel(0)
    with pytest.raises(ValueError, match="cannot be unrolled"):     # composing it (the planner refuses it)
        t.program("exact", wrap=lambda m: itd(2) if m.iters == 4 else m)
    hier, _ = t.program("exact", wrap=lambda m: finite_diff() if m.iters == 4 else m)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        hier.hypergrad("lam")


def test_exact_semantics_rejects_coupled_middles():
    """Two middles that both read a shared lower they are uppers of: a simultaneous game."""
    x = torch.zeros(2, requires_grad=True)
    probs = [Problem(n, (x.clone().detach().requires_grad_(),), lambda *a: sum(t[0].sum() for t in a),
                     reads, sgd(0.1))
             for n, reads in [("top", ("a", "b")), ("a", ("a", "low", "top")),
                              ("b", ("b", "low", "top")), ("low", ("low", "a", "b"))]]
    edges = [Edge("top", "a", 0), Edge("top", "b", 0), Edge("a", "low", 0), Edge("b", "low", 0)]
    with pytest.raises(ValueError, match="simultaneous game"):
        hierarchy(probs, edges, "exact").plan("top")
    hierarchy(probs, edges, "per_edge").plan("top")


def test_hierarchy_validation():
    p = lambda n, reads: Problem(n, (torch.zeros(1, requires_grad=True),), None, reads)  # noqa: E731
    with pytest.raises(ValueError, match="cycle"):
        Hierarchy([p("a", ("a", "b")), p("b", ("b", "a"))], [Edge("a", "b", 0), Edge("b", "a", 0)])
    with pytest.raises(ValueError, match="unknown problems"):
        Hierarchy([p("a", ("a", "zz"))], [])
    with pytest.raises(ValueError, match="different methods"):
        Hierarchy([p("a", ("a",)), p("b", ("b",)), p("c", ("c", "a", "b"))],
                  [Edge("a", "c", 1), Edge("b", "c", 2)])
    with pytest.raises(ValueError, match="semantics"):
        Hierarchy([], [], "nested")


def test_an_edge_whose_lower_ignores_the_upper_contributes_nothing():
    """Declared edge, no dataflow (the frontend's dataflow pass would flag it): no error,
    and the upper's .grad holds only its direct partial."""
    w, lam = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    lower = Problem("w", (w,), lambda w: (w[0] ** 2).sum(), ("w",), sgd(0.1))
    upper = Problem("lam", (lam,), lambda w, l: (w[0] * l[0]).sum(), ("w", "lam"))
    for method, point in ((finite_diff(), w), (neumann(2, 0.1), w), (itd(2), 0.8 ** 2 * w)):
        lam.grad = None  # itd's upper sees θ_K = (1 - 2·0.1)² w
        hierarchy([lower, upper], [Edge("lam", "w", method)]).hypergrad("lam")
        assert torch.allclose(lam.grad, point.detach(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("seed,dag,feedback", [c for c in CASES if c[2]])
def test_a_middle_level_trains_with_its_reduced_gradient(seed, dag, feedback):
    """hypergrad of the middle problem x itself (w at w*(x)): ∂f₂/∂x + (dw*/dx)ᵀ ∂f₂/∂w."""
    t = Trilevel(seed, dag=dag, feedback=feedback)
    hier, lam = t.program("per_edge")
    x, w = hier.problems["x"].params[0], hier.problems["w"].params[0]
    with torch.no_grad():
        x.add_(torch.linspace(-1, 1, len(x), dtype=x.dtype))
        w.copy_(t.w_star(x, lam.detach()))
    hier.hypergrad("x")
    assert rel(x.grad, t.middle_grad("exact")(x.detach(), lam.detach())) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dag", [False, True])
def test_exact_when_the_top_also_reads_the_bottom(seed, dag):
    """Seeds in two problems (x and w), feedback into the middle: `exact` equals autograd
    through the exact nested solves; accumulation equals path enumeration either way."""
    t = Trilevel(seed, dag=dag, top_reads_w=True)
    _, exact, calls, _ = run(t.program, "exact")
    assert rel(exact, torch.func.grad(t.outer)(t.lam0)) < TOL
    assert sorted(calls).count("x") == 1  # the middle's BR-VJP ran once for the top
    for semantics in ("per_edge", "exact"):
        _, accumulated, _, _ = run(t.program, semantics)
        hier, _ = t.program(semantics)
        assert rel(hypergrad_paths(hier, "lam")[0], accumulated) < TOL
