"""`mloc sweep` under signals, and rerun (docs/reliability.md, "`mloc sweep`"): SIGTERM and
Ctrl-C stop its runs as they stop a run (a checkpoint, status `interrupted`, exit 130);
under SIGKILL its runs die with it; rerunning the same command (or `--resume`) skips the
finished points and continues the others. No process the sweep started outlives it.

The sweep has two points of tests/run/faulty.mlo, one at a time: point 0 (6 steps) runs
through; once point 1 (1000 steps) holds its run folder, the test creates the file its loss
waits on while it exists (`lib.ce_stall`), so the test knows, from marker files and the
sweep's own lines, not from a clock, that point 0 finished and point 1 is mid-step.

Before this change SIGTERM killed the sweep (exit 143) and left its runs training, SIGKILL
orphaned them, and the rerun was refused (exit 2, "not empty").
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time

import pytest

from mloc.runtime.files.runfolder import _alive, _read_lock
from tests.run.helpers import FAULTY, mloc, popen

DEADLINE = 240          # seconds; only to stop a hang, never a measurement


def _argv(tmp_path):
    flag = tmp_path / "stall" / "flag"
    flag.parent.mkdir()
    return ["sweep", FAULTY, "--set", "train.steps=6,1000", "--set", f"weights.loss=lib.ce_stall(net, batch, flag='{flag}')",
            "--jobs", 1, "--out", tmp_path / "sweep"], flag


def _lines(proc) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in proc.stderr], daemon=True).start()
    return q


def _until(q: queue.Queue, text: str, seen: list[str]) -> None:
    end = time.monotonic() + DEADLINE
    while not any(text in line for line in seen):
        try:
            seen.append(q.get(timeout=max(end - time.monotonic(), 0.01)))
        except queue.Empty:
            raise AssertionError(f"no {text!r} from the sweep: {''.join(seen)}") from None


def _stalled_run(tmp_path, flag, q, seen):
    """Start state: point 0 finished, point 1 waiting inside its first step. Returns point
    1's run folder and its process (pid, start time), read from its lock."""
    _until(q, ": done in", seen)
    assert "00-" in next(line for line in seen if ": done in" in line), seen
    end = time.monotonic() + DEADLINE
    while (owner := _read_lock(next((tmp_path / "sweep").glob("01-*"), tmp_path))) is None:
        assert time.monotonic() < end, "".join(seen)         # point 1 compiled, its run folder locked
        time.sleep(0.05)
    flag.touch()                                             # its next step waits (the flag is there before its first)
    while not (flag.parent / "stalled").exists():
        assert time.monotonic() < end, "".join(seen)
        time.sleep(0.05)
    assert _alive(*owner), owner
    return next((tmp_path / "sweep").glob("01-*")), owner


def _rerun_continues(tmp_path, argv, resumed: bool) -> None:
    first = next((tmp_path / "sweep").glob("00-*"))
    before = (first / "metrics.jsonl").read_bytes()
    again = mloc(*argv)
    assert again.returncode == 0, again.stderr
    assert f"{first.name}: finished before; skipped" in again.stderr, again.stderr
    assert (": done (resumed) in" in again.stderr) == resumed, again.stderr
    assert (first / "metrics.jsonl").read_bytes() == before          # the finished point is left alone
    second = next((tmp_path / "sweep").glob("01-*"))
    assert json.loads((second / "summary.json").read_text())["status"] == "finished"
    config = json.loads((second / "config.json").read_text())
    assert len(config.get("resumes", [])) == int(resumed), config
    record = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert record["status"] == "finished" and [p["finished"] for p in record["points"]] == [1, 1], record
    assert again.stdout.count("  1/1  ") == 2, again.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_an_interrupted_sweep_stops_its_runs_with_a_checkpoint_and_the_rerun_continues(tmp_path, sig):
    argv, flag = _argv(tmp_path)
    proc, seen = popen(*argv), []
    q = _lines(proc)
    try:
        run_dir, owner = _stalled_run(tmp_path, flag, q, seen)
        proc.send_signal(sig)
        _until(q, "stopping the sweep", seen)
        flag.unlink()                                  # the step in flight finishes, then the run stops
        code = proc.wait(timeout=DEADLINE)
    finally:
        flag.unlink(missing_ok=True)
        proc.kill()
    time.sleep(0.2)                                    # the reader thread drains the last lines
    while not q.empty():
        seen.append(q.get())
    err = "".join(seen)
    assert code == 130, err
    assert not _alive(*owner), "a run outlived the sweep"
    assert "interrupted: 1 of 2 runs finished; stopped with a checkpoint: " + run_dir.name in err, err
    assert "--resume --out" in err and "Traceback" not in err, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (run_dir / "checkpoint.pt").is_file(), summary
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["status"] == "interrupted"
    assert not (tmp_path / "sweep" / ".lock").exists()
    _rerun_continues(tmp_path, argv, resumed=True)


@pytest.mark.slow
def test_a_killed_sweeps_runs_die_with_it_and_the_rerun_continues(tmp_path):
    argv, flag = _argv(tmp_path)
    proc, seen = popen(*argv), []
    q = _lines(proc)
    try:
        run_dir, owner = _stalled_run(tmp_path, flag, q, seen)
        proc.kill()
        proc.wait(timeout=DEADLINE)
        end = time.monotonic() + DEADLINE
        while _alive(*owner) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(*owner), "the stalled run outlived the killed sweep"
    finally:
        flag.unlink(missing_ok=True)
    assert not (run_dir / "summary.json").exists()     # killed, not stopped: nobody wrote one
    # how far the run got before it stalled depends on the machine: resumed from its last
    # checkpoint if it wrote one (`checkpoint every`), else started again
    _rerun_continues(tmp_path, argv, resumed=(run_dir / "checkpoint.pt").is_file())
