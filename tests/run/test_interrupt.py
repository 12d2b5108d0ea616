"""Ctrl-C and SIGTERM (docs/reliability.md, "Interrupting a run"): the run stops at the next
step boundary, writes `checkpoint.pt` there (also without `checkpoint every`), says how to
continue, exits 130, and `--resume` then ends bitwise where an uninterrupted run ends; a
second Ctrl-C aborts at once. `nockpt.mlo` is faulty.mlo without `checkpoint every`.

Before this change an interrupted run without `checkpoint every` lost every step, and its
folder could be neither resumed ("holds no checkpoint.pt") nor reused ("already holds a run").
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.run.helpers import HERE, mloc, popen, records, same_state, step_of

NOCKPT = HERE / "nockpt.mlo"
# Eager throughout: `--compile auto` would compile the 5000-step run after its warm-up and
# leave the short uninterrupted run eager, and a compiled step is not bitwise an eager one
# (tests/compiled/test_compiled_runs.py resumes compiled runs).
SLOW = ("--set", "weights.loss=lib.ce_slow(net, batch, seconds=0.01)", "--compile", "off")


def _wait_for_records(run_dir, step: int, proc, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            if any(r["step"] >= step for r in records(run_dir)):
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)


def _interrupt(run_dir, sig, *extra) -> tuple[int, str]:
    proc = popen("run", NOCKPT, "--steps", 5000, "--out", run_dir, "--quiet", *SLOW, *extra)
    _wait_for_records(run_dir, 8, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _resumes_bitwise(tmp_path, run_dir, *extra) -> None:
    step = step_of(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == step, summary
    status = mloc("runs", run_dir).stdout.splitlines()[1].split()
    assert status[1] == "nockpt_reweighting" and status[-2:] == ["interrupted", "(resumable)"], status
    total = step + 6
    resumed = mloc("run", NOCKPT, "--steps", total, "--resume", run_dir, "--quiet", *SLOW, *extra)
    assert resumed.returncode == 0, resumed.stderr
    full = mloc("run", NOCKPT, "--steps", total, "--out", tmp_path / "full", "--quiet", *SLOW, *extra)
    assert full.returncode == 0, full.stderr
    assert same_state(run_dir, tmp_path / "full")
    keys = [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(run_dir)]
    assert len(keys) == len(set(keys)) and [k[0] for k in keys] == sorted(k[0] for k in keys)


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_an_interrupted_run_checkpoints_and_resumes_bitwise(tmp_path, sig):
    run_dir = tmp_path / "run"
    code, err = _interrupt(run_dir, sig)
    assert code == 130, err
    step = step_of(run_dir)
    assert step >= 8, err
    assert f"interrupted at step {step} of 5000: wrote {run_dir / 'checkpoint.pt'}" in err, err
    assert f"--resume {run_dir} --steps 5000" in err and "Traceback" not in err, err
    assert not (run_dir / ".lock").exists()
    _resumes_bitwise(tmp_path, run_dir)


@pytest.mark.slow
def test_an_interrupted_nproc_run_checkpoints_and_resumes_bitwise(tmp_path):
    run_dir = tmp_path / "run"
    code, err = _interrupt(run_dir, signal.SIGINT, "--nproc", 2)
    assert code == 130, err
    step = step_of(run_dir)
    assert step >= 8 and step % 4 == 0, err         # the ranks agree at a log boundary
    assert f"interrupted at step {step} of 5000: wrote {run_dir / 'checkpoint.pt'}" in err, err
    assert err.count("interrupted at step") == 1 and "Traceback" not in err, err
    _resumes_bitwise(tmp_path, run_dir, "--nproc", 2)


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    """The second Ctrl-C lands while a step is still running (its loss waits on a file for up
    to ten minutes): the run must end inside that step, not after it. Whether it did is read
    from the loss's own marker files, never from a clock."""
    flag, run_dir = tmp_path / "stall", tmp_path / "run"
    proc = popen("run", NOCKPT, "--steps", 5000, "--out", run_dir, "--set",
                 f"weights.loss=lib.ce_stall(net, batch, flag='{flag}')")
    for line in proc.stderr:                        # the banner: training has started
        if line.startswith("training "):
            break
    flag.touch()
    deadline = time.time() + 240                    # only to stop a hang
    while not (tmp_path / "stalled").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    first = ""
    for line in proc.stderr:                        # the first Ctrl-C has been seen
        if "Ctrl-C again to abort" in line:
            first = line
            break
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        flag.unlink(missing_ok=True)
        proc.kill()
    assert proc.returncode == 130, err
    assert not (tmp_path / "unstalled").exists(), "the run finished the step it was asked to abort"
    assert "stopping after this step" in first and "aborted" in err, (first, err)
    assert not (run_dir / "checkpoint.pt").exists(), err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def test_sighup_ends_the_run_as_a_kill_does(tmp_path):
    """A signal mloc does not catch (SIGHUP when the terminal closes, say) ends the run
    where it is, as SIGKILL does ("What a crash leaves behind"): no checkpoint for the steps
    since the last one, no summary; the last checkpoint stays, the lock is free, and
    `--resume` continues from it."""
    from tests.run.helpers import FAULTY
    run_dir = tmp_path / "run"
    proc = popen("run", FAULTY, "--steps", 5000, "--out", run_dir, "--quiet", *SLOW)
    _wait_for_records(run_dir, 12, proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGHUP, err
    step = step_of(run_dir)
    assert step >= 10 and step % 5 == 0, err        # `checkpoint every 5`: the last one written
    assert not (run_dir / "summary.json").exists()
    resumed = mloc("run", FAULTY, "--steps", step + 3, "--resume", run_dir, "--quiet", *SLOW)
    assert resumed.returncode == 0, resumed.stderr
    assert step_of(run_dir) == step + 3
