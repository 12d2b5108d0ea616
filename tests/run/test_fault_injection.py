"""Kill a run at random points, resume it each time, and end bitwise where an
uninterrupted run ends (issue 10): SIGKILL at random moments, SIGKILL inside a checkpoint
write (halfway through the temporary file, before its rename, after it), and, with
`--nproc 2`, SIGKILL of the launcher. 5 kills in the default tier, 20 in the slow one.
After every kill the folder holds the last good checkpoint and no other run's data, and
the metrics are one history at the end. The single-process chains run the compiled
`train.py` (the same run-folder rule and loop as `mloc run`, without compiling at every
start); the `--nproc 2` chain runs `mloc run`."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest

from mloc.cli import main
from tests.conftest import ROOT
from tests.run.helpers import ENV, FAULTY, mloc, records, same_state, step_of

SLOW = ("--set", "weights.loss=lib.ce_slow(net, batch, seconds=0.01)")
INJECTED = ("kill-mid", "kill-before-rename", "kill-after-rename")


def _start(run_dir) -> list[str]:
    """`--out DIR` for the first start (or after a kill before any checkpoint), else `--resume`."""
    if step_of(run_dir) < 0:
        return ["--out", str(run_dir), "--overwrite"]
    return ["--resume", str(run_dir)]


def _kill_at_random(command: list[str], run_dir, rng: random.Random) -> None:
    before = step_of(run_dir)
    proc = subprocess.Popen([*command, *_start(run_dir)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while step_of(run_dir) < before + 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _kill_in_checkpoint(command: list[str], run_dir, mode: str, rng: random.Random) -> None:
    n = rng.randint(1, 3)
    proc = subprocess.run([sys.executable, "-m", "tests.run._inject", mode, str(n), *command[1:], *_start(run_dir)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def kill_and_resume(tmp_path, kinds: list[str], nproc: int, seed: int, steps: int) -> None:
    """`steps` leaves room for every kill (each lets at least 5 steps pass, at most 15)."""
    rng, run_dir, full = random.Random(seed), tmp_path / "killed", tmp_path / "full"
    assert main(["compile", str(FAULTY), "-o", str(tmp_path / "build"), *SLOW]) == 0
    if nproc == 1:
        command = [sys.executable, str(tmp_path / "build" / "train.py"), "--steps", str(steps), "--quiet"]
        assert main(["run", str(FAULTY), "--steps", str(steps), "--out", str(full), "--quiet", *SLOW]) == 0
    else:
        command = [sys.executable, "-m", "mloc", "run", str(FAULTY), "--steps", str(steps), "--nproc", str(nproc),
                   "--quiet", *SLOW]
        assert mloc(*command[3:], "--out", full).returncode == 0
    for kind in kinds:
        if kind == "random":
            _kill_at_random(command, run_dir, rng)
        else:
            _kill_in_checkpoint(command, run_dir, kind, rng)
        # whatever the moment, a checkpoint on disk is a whole one (or there is none yet)
        assert step_of(run_dir) >= 0 or not (run_dir / "checkpoint.pt").exists()
    assert step_of(run_dir) < steps, "a kill came after the end: give the run more steps"
    proc = subprocess.run([*command, *_start(run_dir)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert same_state(run_dir, full)
    keys = [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(run_dir)]
    assert len(keys) == len(set(keys)) and [k[0] for k in keys] == sorted(k[0] for k in keys)
    assert not list(run_dir.glob(".*.tmp")) and not (run_dir / ".lock").exists()


def test_five_kills_then_the_same_bits(tmp_path):
    kill_and_resume(tmp_path, ["random", *INJECTED, "random"], nproc=1, seed=0, steps=100)


@pytest.mark.slow
def test_twelve_kills_of_one_process(tmp_path):
    kinds = ["random"] * 6 + list(INJECTED) * 2
    random.Random(1).shuffle(kinds)
    kill_and_resume(tmp_path, kinds, nproc=1, seed=1, steps=300)


@pytest.mark.slow
def test_eight_kills_of_a_two_process_launcher(tmp_path):
    kill_and_resume(tmp_path, ["random"] * 8, nproc=2, seed=2, steps=150)
