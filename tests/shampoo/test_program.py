"""programs/shampoo_reweighting.mlo: Shampoo at the lower level of a two-level program
(SAMA above it, asynchronous one-step-stale roots). It trains through the Python API,
checkpoints mid-run with a stale-root slot pending and resumes bit for bit, and serves
`itd` (unrolled through Shampoo's update, roots constant) as well."""

from __future__ import annotations

import math

import pytest
import torch

import mloc
from tests.conftest import PROGRAMS

PROGRAM = PROGRAMS / "shampoo_reweighting.mlo"


def params(session) -> dict:
    return {f"{n}.{k}": v.detach().clone() for n in ("classifier", "weight_net")
            for k, v in session.module(n).state_dict().items()}


def test_trains_checkpoints_and_resumes_bit_for_bit(tmp_path):
    """10 steps (the roots of step 10 are pending, due at step 11, computed by the thread),
    save, 6 more; restored from the file (through the checkpoint module) and run 6 steps
    again, the parameters are the same bit for bit; the classifier's loss fell. (A fresh
    process resuming: the slow subprocess test below.)"""
    session = mloc.load(PROGRAM)
    try:
        start = session.run(1)["classifier"]
        session.run(9)
        state = session.program.live["classifier"].problem.state
        assert type(state).__name__ == "ShampooState" and state.pending[0]["step"] == 11
        session.save(tmp_path / "ck.pt")
        end = session.run(6)["classifier"]
        want = params(session)
        session.restore(tmp_path / "ck.pt")
        assert session.steps_done == 10
        session.run(6)
        got = params(session)
    finally:
        session.program.close()
    assert math.isfinite(end) and end < start
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_itd_unrolls_through_shampoo():
    """The same program with `itd(steps=2)` (synchronous roots): the hypergradient of the
    weight net is finite and not zero (the checker accepts itd: Shampoo is differentiable
    with its roots held constant)."""
    s = mloc.load(PROGRAM, set=("weight_net->classifier.hypergrad=itd(steps=2)",
                                "weight_net->classifier.unroll=2",
                                "classifier.optimizer.async_roots=false"))
    try:
        s.run(12)
        grads = s.hypergradients()["weight_net"]
    finally:
        s.program.close()
    flat = torch.cat([g.flatten() for g in grads.values()])
    assert bool(torch.isfinite(flat).all()) and flat.abs().sum() > 0


@pytest.mark.slow
def test_mloc_run_resume_in_a_subprocess(tmp_path):
    """`mloc run --steps 10` then `--resume --steps 16` equals `mloc run --steps 16`: the
    checkpoint (parameters, Shampoo state with its pending slot, data, RNG) is the same
    file bit for bit (slow: three interpreter starts)."""
    from tests.run.helpers import mloc as run, same_state
    full, part = tmp_path / "full", tmp_path / "part"
    assert run("run", PROGRAM, "--steps", "16", "--out", full, "--quiet", "--threads", "1").returncode == 0
    assert run("run", PROGRAM, "--steps", "10", "--out", part, "--quiet", "--threads", "1").returncode == 0
    proc = run("run", PROGRAM, "--steps", "16", "--out", part, "--resume", part, "--quiet", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert same_state(full, part)


def test_train_records_and_loggers_carry_the_rejected_roots(tmp_path):
    """`mloc run --logger csv`: the Shampoo problem's train records hold Shampoo's report
    (no root rejected in this healthy run), written as curves by the loggers too; the Adam
    problem's records hold no such field."""
    from mloc.cli import main
    from mloc.runtime.run.records import read_metrics
    assert main(["run", str(PROGRAM), "--steps", "12", "--out", str(tmp_path), "--threads", "1",
                 "--logger", "csv"]) == 0
    train = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    classifier = [r for r in train if r["problem"] == "classifier"]
    assert classifier and all(r["roots_rejected"] == 0 and r["root_failures"] == 0 for r in classifier)
    assert all("roots_rejected" not in r for r in train if r["problem"] == "weight_net")
    csv_names = (tmp_path / "metrics.csv").read_text()
    assert "classifier/roots_rejected" in csv_names and "classifier/root_failures" in csv_names
