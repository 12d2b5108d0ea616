"""The many-path benchmark (bench/many_paths.py, issue 27) compares the same program.

On the lattice (top, one bottom reading it, levels of two each reading the level before,
the top reading the last), mloc's adjoint accumulation and Betty 0.2.1's path enumeration
must give the same hypergradient of the top in float64 (measured: ≤ 2.2e-16 relative),
and both must equal the closed form of per-edge Neumann(K) on these quadratics (the BR
Jacobian of problem n to a problem u it reads is Q_n B_{n,u}, Q_n = α Σ_{j≤K} (I−αA_n)^j).
mloc applies one BR-VJP per problem below the top (2L − 3); Betty re-applies every BR-VJP
of each of its 2^(L−2) paths (Σ over paths of the path's length). A couple of timed-loop
steps keep the two systems' λ equal. No timings are asserted. Betty is an optional
benchmark dependency: skipped without it.
"""

from __future__ import annotations

import random
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

pytest.importorskip("betty")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # Betty's imports

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import many_paths  # noqa: E402

TOL = 1e-12


def closed_form(lat, iters=many_paths.ITERS, alpha=many_paths.ALPHA):
    """ρλ + Σ_u J_uᵀ C_uᵀ(Σ C θ − e), J_n = Σ_{u read by n} Q_n B_{n,u} J_u, J_top = I."""
    eye = torch.eye(lat.dim, dtype=torch.float64)
    jac = {many_paths.TOP: eye}
    for n in lat.lowers:  # top-down: every problem n reads is already done
        step = eye - alpha * lat.A[n]
        q = alpha * sum(torch.linalg.matrix_power(step, j) for j in range(iters + 1))
        jac[n] = sum(q @ lat.B[n, u] @ jac[u] for u in lat.reads[n])
    last = lat.reads[many_paths.TOP]
    y = sum(lat.C[u] @ lat.start[u] for u in last) - lat.e
    lam = lat.start[many_paths.TOP]
    return many_paths.RHO * lam + sum(jac[u].T @ (lat.C[u].T @ y) for u in last)


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("levels", [3, 4])
def test_both_systems_give_the_closed_form_hypergradient(levels):
    lat = many_paths.Lattice(levels, dim=16, seed=levels)
    c = many_paths.compare(lat)
    exact = closed_form(lat)
    assert c.agreement < TOL
    assert rel(c.mloc_grad, exact) < TOL
    assert rel(c.betty_grad, exact) < TOL


@pytest.mark.parametrize("levels", [3, 4])
def test_brvjp_counts_one_per_problem_against_one_per_path_step(levels):
    lat = many_paths.Lattice(levels, dim=16)
    c = many_paths.compare(lat)
    assert c.mloc_vjps == len(lat.lowers) == 2 * levels - 3
    assert c.paths == c.paths_listed == lat.paths() == 2 ** (levels - 2)
    _, betty = many_paths.betty_system(lat)
    lengths = [len(p) - 2 for p in betty[many_paths.TOP].paths]  # [top, ..., bottom, top]
    assert len(lengths) == c.paths and set(lengths) == {levels - 1}
    assert c.betty_vjps == sum(lengths) == lat.betty_vjps()


@pytest.mark.parametrize("levels", [3, 4])
def test_timed_steps_train_the_same_top(levels):
    args = Namespace(dim=16, iters=2, alpha=0.2, reps=2, warmup=1)
    row = many_paths.run_level(levels, args, random.Random(0))
    assert row["after"] < TOL          # λ after 3 SGD steps of each system
    assert row["c"].agreement < TOL
    assert set(row["med"]) == {"cpu", "wall"} and set(row["med"]["cpu"]) == {"mloc", "betty"}


def test_counting_restores_what_it_wraps():
    import betty.hypergradient as bh
    import betty.problems.problem as bp
    from mloc.runtime.methods import implicit

    before = (implicit.neumann.vjp, bh.jvp_fn_mapping["neumann"], bp.get_grads)
    with many_paths.counting():
        assert implicit.neumann.vjp is not before[0]
    assert (implicit.neumann.vjp, bh.jvp_fn_mapping["neumann"], bp.get_grads) == before
