"""`mloc hypergrad --check` ends with a verdict, and says when its reference is meaningless:
the lower Hessian's spectrum is checked against closed forms (Q: A with eigenvalues
linspace(1, 10); S: an indefinite A with eigenvalues -2, 1, 3, 5, 7, 9), exactly for small
problems and by Hessian-vector-product power iteration (`mloc.runtime.grad.curvature`) above."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mloc.cli import main

HERE = Path(__file__).parent / "oracle_programs"
sys.path.insert(0, str(HERE))

_RANGE = re.compile(r"lower `w`: Hessian eigenvalues in \[(\S+), (\S+)\]")


def check(capsys, program: str) -> str:
    assert main(["hypergrad", str(HERE / program), "--dtype", "float64", "--check"]) == 0
    return capsys.readouterr().out


def test_a_convex_lower_problem_gets_a_verdict_and_its_exact_spectrum(capsys):
    out = check(capsys, "q.mlo")
    lo, hi = map(float, _RANGE.search(out).groups())
    assert abs(lo - 1.0) <= 1e-10 and abs(hi - 10.0) <= 1e-9       # Q's A: linspace(1, 10) (cond 10)
    assert out.rstrip().splitlines()[-1].startswith("verdict: agrees with the CG reference")
    assert "negative curvature" not in out


def test_a_non_convex_lower_problem_makes_the_reference_meaningless(capsys):
    out = check(capsys, "saddle.mlo")
    lo, hi = map(float, _RANGE.search(out).groups())
    assert abs(lo + 2.0) <= 1e-10 and abs(hi - 9.0) <= 1e-10
    assert "negative curvature" in out and "no reference" in out
    assert out.rstrip().splitlines()[-1] == ("verdict: no verdict: the CG reference is meaningless "
                                             "(non-convex lower problem: `w`)")


def test_the_probed_curvature_finds_the_negative_direction():
    """Above the exact limit: power iteration's Rayleigh quotient, a certificate <= 0."""
    import mloc
    from mloc.runtime.grad.curvature import lower_curvature

    session = mloc.load(HERE / "saddle.mlo", dtype="float64")
    try:
        probed = lower_curvature(session.program, "w", full=0, iters=200)
        exact = lower_curvature(session.program, "w")
    finally:
        session.program.close()
    assert exact.exact and not probed.exact
    assert abs(probed.lam_max - 9.0) <= 1e-8 and abs(probed.lam_min + 2.0) <= 1e-8
    assert probed.indefinite(1e-8) and exact.indefinite(1e-8)


def test_json_keeps_stdout_one_object(capsys):
    import json

    assert main(["hypergrad", str(HERE / "saddle.mlo"), "--dtype", "float64", "--check", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "verdict:" in captured.err
