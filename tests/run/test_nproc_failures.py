"""`--nproc N` failures (issue 10, case 4): a failure on any rank is reported once, as in
a single-process run (the first failing rank's diagnostic, with its rank; exit 1, 130 for
Ctrl-C, which stops with a checkpoint; no launcher traceback); the workers die with their launcher, whatever signal
kills it; a run folder in use by a live run is refused.

Before this change (torchrun, measured with these programs): a user error on rank 1 gave
50 lines (rank 0 also blamed the user's code for gloo's "Connection closed by peer"), a
NaN on rank 1 46 lines, Ctrl-C 68 lines and exit 1, and a SIGKILLed launcher left both
workers training. Each run here starts three processes, so all but one are in the slow tier.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.run.helpers import FAULTY, alive, descendants, mloc, popen, step_of

SLOW_LOSS = ("--set", "weights.loss=lib.ce_slow(net, batch, seconds=0.02)")


@pytest.mark.slow
def test_a_user_error_on_one_rank_is_reported_once(tmp_path):
    proc = mloc("run", FAULTY, "--nproc", 2, "--out", tmp_path, "--quiet",
                "--set", "weights.loss=lib.ce_raising(net, batch, rank=1, after=12)")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error[E702]: the program's code raised ValueError during step ")
    assert "on rank 1 of 2: labels out of range (rank 1)" in lines[0]
    assert len(lines) <= 6 and lines[-1].startswith("  = help:")
    for noise in ("Traceback", "gloo", "Connection closed", "ChildFailedError", "torch.distributed"):
        assert noise not in proc.stderr
    assert step_of(tmp_path) == 10 and not (tmp_path / ".lock").exists()


@pytest.mark.slow
def test_a_nan_on_one_rank_is_reported_once(tmp_path):
    proc = mloc("run", FAULTY, "--nproc", 2, "--out", tmp_path, "--quiet",
                "--set", "weights.loss=lib.ce_nan(net, batch, rank=1, after=12)")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 3, lines
    assert "the hypergradient of problem `weights` became NaN or Inf at step" in lines[0] and " of 2" in lines[0]
    assert lines[1].startswith("  = note: found by the check after step ")
    assert step_of(tmp_path) == 10


def wait_for_step(run_dir, step: int, proc, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while step_of(run_dir) < step:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_with_a_checkpoint_and_130(tmp_path):
    proc = popen("run", FAULTY, "--nproc", 2, "--steps", 5000, "--out", tmp_path, "--quiet", *SLOW_LOSS)
    wait_for_step(tmp_path, 10, proc)
    os.killpg(proc.pid, signal.SIGINT)                  # what a terminal's Ctrl-C does
    _, err = proc.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 2, err
    assert lines[0].startswith("stopping at the next log step") and lines[1].startswith(
        f"interrupted at step {step_of(tmp_path)} of 5000: wrote {tmp_path / 'checkpoint.pt'}"), err
    assert step_of(tmp_path) >= 10 and not (tmp_path / ".lock").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])    # SIGTERM: a graceful stop, then gone
def test_the_workers_die_with_their_launcher(tmp_path, sig):
    proc = popen("run", FAULTY, "--nproc", 2, "--steps", 5000, "--out", tmp_path, "--quiet", *SLOW_LOSS)
    wait_for_step(tmp_path, 10, proc)
    workers = descendants(proc.pid)
    assert len(workers) >= 2
    proc.send_signal(sig)
    proc.wait(timeout=30)
    deadline = time.time() + 10
    while any(alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(w) for w in workers)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    time.sleep(1.0)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    # the lock names a dead launcher: the run resumes
    assert mloc("run", FAULTY, "--steps", step_of(tmp_path) + 2, "--resume", tmp_path, "--quiet").returncode == 0


@pytest.mark.slow
def test_a_folder_in_use_by_a_running_run_is_refused(tmp_path):
    proc = popen("run", FAULTY, "--nproc", 2, "--steps", 5000, "--out", tmp_path, "--quiet", *SLOW_LOSS)
    try:
        wait_for_step(tmp_path, 5, proc)
        second = mloc("run", FAULTY, "--steps", 6000, "--resume", tmp_path, "--quiet")
        assert second.returncode == 2 and f"is in use by process {proc.pid}" in second.stderr, second.stderr
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_per_replica_parts_are_warned_about_once(tmp_path):
    proc = mloc("run", FAULTY, "--nproc", 2, "--steps", 4, "--out", tmp_path,
                "--set", "weights->net.hypergrad=itd()")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning:") == 1
    assert "the itd edge weights->net runs per replica" in proc.stderr
