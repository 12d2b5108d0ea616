"""`mloc run --pipeline` under `--nproc`'s supervision (issue 23, point 6): the stage
processes die with their launcher, whatever signal it gets; Ctrl-C and SIGTERM stop every
stage after the same step with a checkpoint, from which `--pipeline --resume` ends bitwise
where an uninterrupted pipeline ends; a stage that writes a lot to stderr does not hang
the run; a stage that fails is reported once, by name. Nothing is left in the temporary
directory (each run gets a TMPDIR of its own here, so the tests can say exactly what mloc
left there) except, after a SIGKILL, the launcher's log folder, which the next start removes.

Before (commit 0f0014f): a killed launcher left the stages training; a stage writing 2 KB
a step hung the run for ever (stderr went to a pipe nobody read); a stage killed ended the
run with `error: pipeline worker 1 failed:` and nothing else; a user error in a stage
printed its traceback; there were no checkpoints. Every run starts four interpreters: slow tier.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.interlock.programs import HERE
from tests.run.helpers import ENV, alive, default_signals, descendants, step_of

pytestmark = pytest.mark.slow

PROGRAM = """program faulty_chain
import hand as h
import chain_faults as f
problem stage1 {{
    module    = h.Block(fan_in=5, width=7)
    data      = h.blobs(batch_size=16)
    loss      = h.loss1(stage1, batch)
    optimizer = sgd(lr=0.1, momentum=0.9)
}}
problem stage2 {{
    module    = h.Block(fan_in=7, width=6)
    data      = h.blobs(batch_size=16)
    loss      = {loss2}
    optimizer = sgd(lr=0.1, momentum=0.9)
}}
problem stage3 {{
    module    = h.Block(fan_in=6, width=4)
    data      = h.blobs(batch_size=16)
    loss      = h.loss3(stage1, stage2, stage3, batch)
    optimizer = adam(lr=0.01)
}}
chain [stage1, stage2, stage3] {{ interlock = 2 }}
train {{
    steps = 10
    seed = 0
    checkpoint every 5
}}
"""
PLAIN = "h.loss2(stage1, stage2, batch)"
STOP_NOTE = "stopping after this step to write a checkpoint; Ctrl-C again to abort without one"


def program(folder: Path, loss2: str = PLAIN) -> Path:
    for module in ("hand.py", "chain_faults.py"):
        shutil.copy(HERE / module, folder / module)
    path = folder / "faulty_chain.mlo"
    text = PROGRAM.format(loss2=loss2)
    if "f." not in loss2:               # no warning for an unused import
        text = text.replace("import chain_faults as f\n", "")
    path.write_text(text, encoding="utf-8")
    return path


def env(tmp: Path) -> dict:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    return {**ENV, "TMPDIR": str(tmp / "tmpdir")}


def start(tmp: Path, *argv) -> subprocess.Popen:
    """`mloc run ARGV --pipeline` in the background, in a session of its own (as a terminal
    would run it: a test can signal it, or its whole group, as Ctrl-C does)."""
    return subprocess.Popen([sys.executable, "-m", "mloc", "run", *map(str, argv), "--pipeline", "--quiet",
                             "--dtype", "float64"], cwd=ROOT, env=env(tmp), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """Its stderr once it has exited; a hang fails the test (its whole group killed)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"mloc run --pipeline did not finish within {timeout} s")


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while step_of(run_dir) < step:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"no checkpoint at step {step} (exit {proc.poll()}): {proc.communicate()[1]}")
        time.sleep(0.05)


def scratch(tmp: Path) -> list[str]:
    """What mloc left in the run's TMPDIR (not the caches of torch and lark kept there)."""
    return sorted(p.name for p in (tmp / "tmpdir").glob("mloc-*"))


def all_gone(pids, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def stages(run_dir: Path) -> list[dict]:
    return [torch.load(run_dir / f"stage{k}.pt") for k in range(3)]


def bitwise(a: list[dict], b: list[dict]) -> bool:
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """The stages after 40 steps of a pipeline that was never stopped."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    proc = start(tmp, program(tmp), "--steps", 40, "--out", tmp / "run")
    err = finish(proc)
    assert proc.returncode == 0, err
    return stages(tmp / "run")


def test_a_stage_that_writes_a_lot_to_stderr_does_not_hang_the_run(tmp_path):
    proc = start(tmp_path, program(tmp_path, "f.loss2_chatty(stage1, stage2, batch)"), "--steps", 150,
                 "--out", tmp_path / "run")
    err = finish(proc)                  # 150 steps of 2 KB: five times what a pipe holds
    assert proc.returncode == 0, err[-2000:]
    assert "chatty" not in err          # worker 1's stderr went to its file; shown only if it fails
    assert step_of(tmp_path / "run") == 150 and (tmp_path / "run" / "stage1.pt").is_file()
    assert not scratch(tmp_path)


def test_a_user_error_in_one_stage_is_reported_once_by_name(tmp_path):
    proc = start(tmp_path, program(tmp_path, "f.loss2_raising(stage1, stage2, batch, after=12)"), "--steps", 40,
                 "--out", tmp_path / "run")
    err = finish(proc)
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err
    assert lines[0] == ("error[E702]: the program's code raised ValueError during step 13 on pipeline worker 1 "
                        "of 3 (stage `stage2`): labels out of range (stage 2)"), err
    assert len(lines) <= 6 and lines[-1].startswith("  = help:") and "chain_faults.py" in err, err
    for noise in ("Traceback", "gloo", "Connection", "torch.distributed", "error: pipeline worker"):
        assert noise not in err
    assert step_of(tmp_path / "run") == 10 and not (tmp_path / "run" / ".lock").exists()
    assert not scratch(tmp_path)


def _worker(launcher: int, rank: int) -> int:
    for pid in descendants(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mloc.runtime.processes.pipeline_stage" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode():
            return pid
    raise AssertionError(f"no worker of rank {rank} below {launcher}")


def test_a_killed_stage_is_reported_once_by_name(tmp_path):
    proc = start(tmp_path, program(tmp_path), "--steps", 100000, "--pipeline-delay", 0.02, "--out", tmp_path / "run")
    wait_for_step(tmp_path / "run", 5, proc)
    workers = descendants(proc.pid)
    os.kill(_worker(proc.pid, 1), signal.SIGKILL)
    err = finish(proc, timeout=60)
    assert proc.returncode == 1, err
    assert err.strip().splitlines() == ["error: pipeline worker 1 of 3 (stage `stage2`) was killed by SIGKILL",
                                        "  = help: the system may have run out of memory"], err
    assert all_gone(workers)
    assert not scratch(tmp_path)


def test_the_stages_die_with_a_killed_launcher_and_the_next_start_cleans_up(tmp_path):
    run = tmp_path / "run"
    proc = start(tmp_path, program(tmp_path), "--steps", 100000, "--pipeline-delay", 0.02, "--out", run)
    wait_for_step(run, 5, proc)
    workers = descendants(proc.pid)
    assert len(workers) >= 3
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert all_gone(workers)
    before = (run / "checkpoint.pt").read_bytes()
    time.sleep(1.0)
    assert (run / "checkpoint.pt").read_bytes() == before and not list(run.glob("stage*.pt"))
    left = scratch(tmp_path)            # what a SIGKILL cannot clean: the launcher's log folder
    assert [name.split("-")[:3] for name in left] == [["mloc", "workers", str(proc.pid)]]
    # the lock names a dead launcher: the run resumes, and that start removes the folder
    step = step_of(run)
    again = start(tmp_path, tmp_path / "faulty_chain.mlo", "--steps", step + 2, "--resume", run)
    err = finish(again)
    assert again.returncode == 0, err
    assert step_of(run) == step + 2 and not scratch(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_every_stage_with_a_checkpoint_that_resumes_bitwise(tmp_path, sig, uninterrupted):
    run = tmp_path / "run"
    proc = start(tmp_path, program(tmp_path), "--steps", 40, "--pipeline-delay", 0.1, "--out", run)
    wait_for_step(run, 5, proc)
    workers = descendants(proc.pid)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)          # what a terminal's Ctrl-C does
    else:
        proc.send_signal(signal.SIGTERM)
    err = finish(proc, timeout=120)
    lines = err.strip().splitlines()
    at = step_of(run)
    assert proc.returncode == 130 and len(lines) == 2, err
    assert lines[0] == STOP_NOTE and 5 <= at < 40, err
    assert lines[1] == (f"interrupted at step {at} of 40: wrote {run / 'checkpoint.pt'}; continue with "
                        f"`--pipeline --resume {run} --steps 40`"), err
    assert all_gone(workers, timeout=1) and not (run / ".lock").exists()
    assert not scratch(tmp_path)
    again = start(tmp_path, tmp_path / "faulty_chain.mlo", "--steps", 40, "--resume", run)
    err = finish(again)
    assert again.returncode == 0, err
    assert step_of(run) == 40 and bitwise(stages(run), uninterrupted)
