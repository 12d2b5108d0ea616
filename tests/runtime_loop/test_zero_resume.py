"""Checkpoints under `--strategy zero` (slow tier): written gathered, the whole optimizer
state as a `ddp` run writes it, so that a resumed run equals an uninterrupted one bitwise
whichever strategy wrote the checkpoint and whichever resumes it, and a checkpoint resumes
into another world size."""

from __future__ import annotations

import pytest

from mloc.runtime.program.checkpoint import load_checkpoint
from tests.run.helpers import SMALL, mloc, same_state

SETS = ("--set", "net.optimizer=adam(lr=0.01)", "--set", "weights->net.hypergrad=sama")


def _run(out, steps: int, strategy: str, *extra) -> None:
    proc = mloc("run", SMALL, "--steps", steps, "--out", out, "--quiet", "--compile", "off", "--nproc", "2",
                "--strategy", strategy, *SETS, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_resumed_zero_run_equals_an_uninterrupted_one_bitwise_from_either_strategy(tmp_path):
    whole = tmp_path / "whole"
    _run(whole, 10, "zero")
    for wrote, resumes in (("zero", "zero"), ("zero", "ddp"), ("ddp", "zero")):
        out = tmp_path / f"{wrote}-{resumes}"
        _run(out, 5, wrote)
        _run(out, 10, resumes, "--resume", out)
        assert same_state(out, whole), (wrote, resumes)


@pytest.mark.slow
def test_a_zero_checkpoint_holds_the_whole_state_and_resumes_into_one_process(tmp_path):
    two, ddp = tmp_path / "two", tmp_path / "ddp"
    _run(two, 5, "zero")
    _run(ddp, 5, "ddp")
    assert same_state(two, ddp)            # gathered: what the replicated run writes, bitwise
    state = load_checkpoint(two / "checkpoint.pt", None)["problems"]["net"]["optimizer"]
    assert state["_type"] == "AdamState" and len(state["mu"]) == 4
    proc = mloc("run", SMALL, "--steps", 8, "--quiet", "--compile", "off", "--nproc", "1", "--resume", two)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_checkpoint(two / "checkpoint.pt", None)["step"] == 8
