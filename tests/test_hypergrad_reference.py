"""`mloc hypergrad --check` compares with a reference independent of the method checked, and
errors in the program's code under `mloc hypergrad` are E702 (exit 1), as under `mloc run`.

- an `itd` edge is compared with CG to convergence, not with itself: on oracle Q (lower
  ½wᵀAw − (Bλ)ᵀw at its solution, SGD with rate η) K unrolled steps give
  dw_K/dλ = A⁻¹(I − (I − ηA)ᴷ)B, so itd's hypergradient and its distance to the implicit
  one (the oracle's closed form) are both known exactly;
- MAML (`init`, a lower loss that does not read the upper) has no implicit reference: said so;
- a BatchNorm in the lower problem (tests/buffers/bn.mlo): the curvature of `--check` ran
  Hessian-vector products through a graph whose saved running statistics had been restored
  in place (exit 101, "modified by an inplace operation"); its spectrum is checked against
  the full Hessian computed independently (`torch.autograd.functional.hessian`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mloc.cli import main

TESTS = Path(__file__).parent
ORACLES = TESTS / "oracle_programs"
sys.path.insert(0, str(ORACLES))
import oracles  # noqa: E402

BN = TESTS / "buffers" / "bn.mlo"
ERRS = TESTS / "hgrad_errors" / "errs.mlo"


def _itd_closed_form(q, steps: int, lr: float) -> torch.Tensor:
    """λ's hypergradient through `steps` SGD steps of the lower, from w* (oracle Q)."""
    w = q.w_star(q.lam0)
    eye = torch.eye(q.A.shape[0], dtype=q.A.dtype)
    dw = torch.linalg.solve(q.A, eye - torch.linalg.matrix_power(eye - lr * q.A, steps)) @ q.B
    return q.rho * q.lam0 + dw.T @ q.C.T @ (q.C @ w - q.dv)


def test_check_on_itd_compares_with_cg_to_convergence_not_itself(capsys):
    code = main(["hypergrad", str(ORACLES / "q.mlo"), "--dtype", "float64", "--check", "--json",
                 "--set", "lam->w.hypergrad=itd(steps=20)", "--set", "lam->w.unroll=20"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    got = json.loads(captured.out)["lam"]
    q = oracles.Q(0)
    itd, exact = _itd_closed_form(q, 20, 0.01), q.exact()
    assert float((torch.tensor(got["v"], dtype=torch.float64) - itd).norm() / itd.norm()) <= 1e-10
    distance = float((itd - exact).norm() / exact.norm())
    assert distance > 0.1                                       # itd(20) is far from the implicit answer here
    assert abs(got["_relative_error"] - distance) <= 1e-8 * distance
    assert "`lam -> w` unrolls (itd)" in captured.err and "verdict: differs from the CG reference" in captured.err


def test_check_says_no_reference_applies_to_maml(capsys):
    assert main(["hypergrad", str(TESTS / "init_programs" / "maml.mlo"), "--dtype", "float64", "--check",
                 "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "no reference: `task` starts from `meta`'s parameters (init)" in out
    assert out.rstrip().splitlines()[-1] == "verdict: no verdict: no reference applies to `meta` (see above)"
    assert "relative error" not in out


def test_check_with_batchnorm_in_the_lower_problem(capsys):
    assert main(["hypergrad", str(BN), "--dtype", "float64", "--check", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "lower `net`: Hessian eigenvalues in" in out and out.rstrip().splitlines()[-1].startswith("verdict:")


def test_batchnorm_curvature_matches_the_full_hessian_and_keeps_the_buffers():
    import mloc
    from mloc.runtime.grad.curvature import lower_curvature

    session = mloc.load(BN, dtype="float64")
    program = session.program
    try:
        program.outer_step()
        program.live["net"].module.net[3].p = 0.0      # no dropout: both computations see one loss
        buffers = [b.clone() for b in program.live["net"].module.buffers()]
        got = lower_curvature(program, "net")
        after = [b.clone() for b in program.live["net"].module.buffers()]
        lv = program.live["net"]
        theta = tuple(lv.problem.params)
        others = {i: program.live[r].problem.params for i, r in enumerate(lv.problem.reads) if r != "net"}
        i = lv.problem.reads.index("net")
        shapes = [t.shape for t in theta]

        def loss(flat):
            parts = torch.split(flat, [t.numel() for t in theta])
            args = [None] * len(lv.problem.reads)
            args[i] = tuple(p.view(s) for p, s in zip(parts, shapes))
            for j, v in others.items():
                args[j] = v
            return lv.problem.loss(*args)

        flat = torch.cat([t.detach().reshape(-1) for t in theta])
        h = torch.autograd.functional.hessian(loss, flat)
    finally:
        program.close()
    lam = torch.linalg.eigvalsh((h + h.T) / 2)
    assert got.exact and got.size == flat.numel()
    assert abs(got.lam_min - float(lam[0])) <= 1e-10 * float(lam.abs().max())
    assert abs(got.lam_max - float(lam[-1])) <= 1e-10 * float(lam.abs().max())
    assert all(torch.equal(a, b) for a, b in zip(buffers, after))   # the running statistics untouched


def test_a_loss_raising_during_after_is_e702(capsys):
    code = main(["hypergrad", str(ERRS), "--after", "5", "--color", "never",
                 "--set", "weights.loss=lib.ce_raising_after(net, batch, after=3)"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "error[E702]: the program's code raised ValueError during step" in err and "of --after 5" in err
    assert "labels out of range" in err and "E900" not in err


def test_a_constructor_raising_on_the_real_device_is_e702(capsys):
    code = main(["hypergrad", str(ERRS), "--color", "never", "--set", "weights.module=lib.RealOnly()"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "error[E702]: the program's code raised ValueError during building the program" in err
    assert "no weights file" in err and "errs.py" in err and "E900" not in err
