"""programs/darts.mlo (DARTS on scikit-learn's digits) and its module programs/darts.py: the
program checks and runs, the search space is what its docstring says, and `derive`,
`random_arch` and `retrain` do what bench/darts_compare.py relies on."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("sklearn")        # the digits ship with scikit-learn (a test dependency)

import mloc  # noqa: E402
from tests.conftest import PROGRAMS, ROOT  # noqa: E402

sys.path.insert(0, str(PROGRAMS))
import darts  # noqa: E402

PROGRAM = PROGRAMS / "darts.mlo"


def _mloc(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mloc", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_the_program_checks():
    done = _mloc("check", str(PROGRAM))
    assert done.returncode == 0 and "darts.mlo: ok" in done.stdout + done.stderr


def test_a_few_steps_train_alpha_and_leave_batchnorm_statistics_to_the_weights():
    torch.set_num_threads(1)
    prog = mloc.load(PROGRAM)
    (edge,) = prog.plan.edges
    assert (edge.upper, edge.lower, edge.method, edge.unroll) == ("arch", "net", "finite_diff", 1)
    net, arch = prog.module("net"), prog.module("arch")
    alpha0 = arch.alpha.detach().clone()
    bn = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(bn) == 1 + 2 * darts.EDGES                                 # stem + two convs per edge
    assert [m.affine for m in bn].count(True) == 1                        # DARTS' search BN: not affine
    losses = prog.run(2)
    assert set(losses) == {"net", "arch"} and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert not torch.equal(arch.alpha.detach(), alpha0)                   # α took two steps
    stats = [m.running_mean.clone() for m in bn]
    hyper = prog.hypergradients()["arch"]["alpha"]
    assert hyper.shape == (darts.EDGES, len(darts.OPS)) and hyper.abs().sum() > 0
    assert all(torch.equal(m.running_mean, s) for m, s in zip(bn, stats))  # the hypergradient leaves them


def test_finite_diff_is_darts_with_xi_1_and_sama_with_xi_the_learning_rate():
    """DARTS' eq. 7 is ∇_α L_val − ξ ∇²_{α,w} L_train ∇_w L_val. `first_order` is its first
    term; `finite_diff` (and Betty's `darts`) subtracts the mixed term with ξ = 1 by default;
    `sama` over SGD scales it by the weights' rate (0.05), DARTS' choice ξ = lr: so
    sama = first_order + 0.05 · (finite_diff − first_order), in float64 to round-off; and
    `finite_diff(xi=0.05)` is `sama` here, bit for bit (the same q = 0.05 · v)."""
    torch.set_num_threads(1)
    grads = {}
    for method in ("finite_diff(eps=0.01)", "first_order", "sama(eps=0.01)", "finite_diff(eps=0.01, xi=0.05)"):
        prog = mloc.load(PROGRAM, set=[f"arch->net.hypergrad={method}"], dtype="float64")
        grads[method] = prog.hypergradients()["arch"]["alpha"]
    fd, fo, sama, fd_lr = grads.values()
    assert (fd - fo).norm() > 0.1 * fo.norm()                             # the mixed term is there
    torch.testing.assert_close(sama, fo + 0.05 * (fd - fo), rtol=1e-9, atol=1e-12)
    assert torch.equal(fd_lr, sama)


def test_derive_reads_the_run_folder(tmp_path):
    out = tmp_path / "run"
    done = _mloc("run", str(PROGRAM), "--steps", "3", "--threads", "1", "--compile", "off", "--quiet",
                 "--set", "train.steps=3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    arch = darts.derive(out, quiet=True)
    assert darts.check_arch(arch) == arch
    alpha = torch.load(out / "best.pt", weights_only=True)["payload"]["problems"]["arch"]["module"]["alpha"]
    assert darts.arch_from_alpha(alpha) == arch


def test_the_derivation_skips_zero_and_takes_the_argmax():
    alpha = torch.zeros(darts.EDGES, len(darts.OPS))
    alpha[:, darts.OPS.index("zero")] = 5.0
    for k, op in enumerate(darts.OPS[1:] + darts.OPS[1:2]):
        alpha[k, darts.OPS.index(op)] = 1.0
    assert darts.arch_from_alpha(alpha) == ("skip", "conv3x3", "conv1x1", "avgpool", "maxpool", "skip")


def test_random_architectures_are_deterministic_per_seed_and_in_the_space():
    assert darts.random_arch(1) == darts.random_arch(1)
    drawn = {darts.random_arch(s) for s in range(20)}
    assert len(drawn) == 20
    assert all(darts.check_arch(a) == a for a in drawn)
    assert set().union(*drawn) == set(darts.OPS[1:])
    with pytest.raises(ValueError):
        darts.check_arch(("zero",) * darts.EDGES)


def test_the_derived_network_has_one_operation_per_edge_and_retrains_deterministically():
    arch = darts.random_arch(3)
    net = darts.Network(arch=arch)
    (cell,) = net.cells
    assert [type(e).__name__ for e in cell.edges] == [type(darts.make_op(o, 16)).__name__ for o in arch]
    assert all(m.affine for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d))
    torch.set_num_threads(1)
    a, b = darts.retrain(arch, seed=5, steps=3), darts.retrain(arch, seed=5, steps=3)
    assert a == b and 0.0 <= a <= 1.0


@pytest.mark.slow
def test_one_seed_of_the_search_then_retraining_beats_chance(tmp_path):
    """One full search (200 steps of finite_diff), derived and retrained for 400 steps."""
    out = tmp_path / "search"
    done = _mloc("run", str(PROGRAM), "--seed", "1", "--threads", "1", "--compile", "off", "--quiet", "--out", str(out),
                 timeout=1800)
    assert done.returncode == 0, done.stderr
    arch = darts.derive(out, quiet=True)
    torch.set_num_threads(1)
    assert darts.retrain(arch, seed=1) > 0.8
