"""Which folder a run writes into, and what it leaves there (issue 10, cases 1, 5 and 7).

The rule: without --resume, --out must hold no run (or --overwrite); without --out, a
fresh runs/PROGRAM/N. --resume DIR continues in DIR, unless --out names another folder,
which must hold no run and receives a copy. Most cases run `mloc run` in this process
(fast); the ones about separate processes (the lock, train.py) start children.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.cli import main
from tests.run.helpers import ENV, FAULTY, HERE, SMALL, mloc, records, same_state, step_of

RUN = ("--quiet", "--device", "cpu")


def run(*argv) -> int:
    return main(["run", str(SMALL), *map(str, argv), *RUN])


def snapshot(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}


def test_resume_into_a_folder_holding_another_run_is_refused(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("--steps", 5, "--out", a) == 0 and run("--steps", 7, "--seed", 3, "--out", b) == 0
    before_a, before_b = snapshot(a), snapshot(b)
    capsys.readouterr()
    assert run("--steps", 10, "--resume", a, "--out", b) == 2
    err = capsys.readouterr().err
    assert f"{b} holds another run than {a}" in err and "--overwrite" in err
    assert snapshot(a) == before_a and snapshot(b) == before_b


def test_resume_into_a_new_folder_copies_the_run_and_leaves_the_original(tmp_path):
    a, b, full = tmp_path / "a", tmp_path / "b", tmp_path / "full"
    assert run("--steps", 5, "--out", a) == 0
    before_a = snapshot(a)
    assert run("--steps", 10, "--resume", a, "--out", b) == 0
    assert snapshot(a) == before_a
    assert run("--steps", 10, "--out", full) == 0
    assert same_state(b, full)
    keys = [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(b)]
    assert keys == [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(a)] + \
        [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(full) if r["step"] > 5]
    config = json.loads((b / "config.json").read_text())
    assert config["resumes"][0]["resumed_from"] == str(a.resolve())


def test_resume_without_out_continues_in_that_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run("--steps", 5) == 0                        # runs/small/1
    assert run("--steps", 5) == 0                        # runs/small/2, `latest`
    runs = tmp_path / "runs" / "small"
    assert sorted(p.name for p in runs.iterdir()) == ["1", "2", "latest"]
    assert os.readlink(runs / "latest") == "2"
    second = snapshot(runs / "2")
    assert run("--steps", 8, "--resume", runs / "1") == 0
    assert step_of(runs / "1") == 8 and snapshot(runs / "2") == second
    assert sorted(p.name for p in runs.iterdir()) == ["1", "2", "latest"]


def test_a_run_folder_records_what_ran(tmp_path):
    assert run("--steps", 5, "--seed", 4, "--out", tmp_path, "--set", "train.steps=9") == 0
    config = json.loads((tmp_path / "config.json").read_text())["run"]
    assert config["program"]["file"] == str(SMALL.resolve())
    assert len(config["program"]["sha256"]) == 64 and config["program"]["set"] == ["train.steps=9"]
    assert (config["steps"], config["seed"], config["device"], config["precision"], config["nproc"]) == \
        (5, 4, "cpu", "fp32", 1)
    assert config["mloc"] and config["torch"] and config["resumed_from"] is None


def test_a_folder_with_metrics_but_no_checkpoint_holds_a_run(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 99, "problem": "net", "loss": 1.0}\n')
    assert run("--steps", 5, "--out", tmp_path) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert run("--steps", 5, "--out", tmp_path, "--overwrite") == 0
    assert all(r["step"] <= 5 for r in records(tmp_path))


def test_resume_drops_the_records_past_the_checkpoint(tmp_path):
    """A run killed after writing records for step 10 but before its step-10 checkpoint:
    resuming from step 5 writes step 10 again, once, and the file stays one history."""
    assert run("--steps", 5, "--out", tmp_path) == 0
    at5 = (tmp_path / "checkpoint.pt").read_bytes()
    assert run("--steps", 10, "--resume", tmp_path) == 0
    (tmp_path / "checkpoint.pt").write_bytes(at5)        # as if killed before the step-10 checkpoint
    assert run("--steps", 10, "--resume", tmp_path) == 0
    keys = [(r["step"], r["problem"], r.get("eval"), r.get("kind")) for r in records(tmp_path)]
    assert len(keys) == len(set(keys)) and [k[0] for k in keys] == sorted(k[0] for k in keys)
    assert [k[0] for k in keys].count(10) == 5         # net, weights, speed, the evaluation, the summary


def test_temporary_files_of_a_killed_run_go_on_the_next_start(tmp_path):
    assert run("--steps", 5, "--out", tmp_path) == 0
    (tmp_path / ".checkpoint.pt.k3j2.tmp").write_bytes(b"half a checkpoint")
    assert run("--steps", 7, "--resume", tmp_path) == 0
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("steps", [3, 5])
def test_resume_with_steps_not_above_the_checkpoint_is_refused(tmp_path, capsys, steps):
    assert run("--steps", 5, "--out", tmp_path) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert run("--steps", steps, "--resume", tmp_path) == 2
    err = capsys.readouterr().err
    assert "is at step 5" in err and "nothing left to train" in err and "--steps above 5" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("n", ["0", "-2"])
def test_nproc_below_one_is_a_usage_error(tmp_path, capsys, n):
    assert main(["run", str(SMALL), "--nproc", n, "--out", str(tmp_path)]) == 2
    assert f"--nproc must be at least 1, got {n}" in capsys.readouterr().err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_a_folder_locked_by_a_live_process_is_refused_and_a_dead_ones_lock_is_taken(tmp_path, capsys):
    assert run("--steps", 5, "--out", tmp_path) == 0
    hold = ("import sys, time; from pathlib import Path; from mloc.runtime.files.runfolder import Choice, RunFolder\n"
            "with RunFolder(Choice(Path(sys.argv[1]))):\n    print('held', flush=True); time.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert other.stdout.readline() == "held\n"
        before = snapshot(tmp_path)
        capsys.readouterr()
        assert run("--steps", 8, "--resume", tmp_path) == 2
        assert f"is in use by process {other.pid}" in capsys.readouterr().err
        assert snapshot(tmp_path) == before
    finally:
        other.kill()
        other.wait()
    assert (tmp_path / ".lock").read_text().split()[0] == str(other.pid)    # what a killed run leaves
    assert run("--steps", 8, "--resume", tmp_path) == 0      # its owner is gone: a stale lock
    assert step_of(tmp_path) == 8 and not (tmp_path / ".lock").exists()


def test_an_error_in_an_evaluation_names_the_step_it_followed(tmp_path):
    proc = mloc("run", HERE / "faulty_eval.mlo", "--out", tmp_path, "--quiet")
    assert proc.returncode == 1
    assert "raised RuntimeError during the evaluations after step 10" in proc.stderr, proc.stderr
    assert step_of(tmp_path) == 5         # the step-10 checkpoint follows the evaluations


def test_train_py_obeys_the_same_rule(tmp_path):
    assert main(["compile", str(SMALL), "-o", str(tmp_path / "build")]) == 0
    train = tmp_path / "build" / "train.py"

    def python(*argv):
        return subprocess.run([sys.executable, str(train), "--quiet", *map(str, argv)], capture_output=True,
                              text=True, cwd=tmp_path, env=ENV, timeout=300)

    assert python("--steps", 5).returncode == 0
    first = tmp_path / "runs" / "small_reweighting" / "1"
    assert step_of(first) == 5 and json.loads((first / "config.json").read_text())["run"]["program"]["file"]
    before = snapshot(first)
    refused = python("--steps", 5, "--out", first)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr
    assert snapshot(first) == before
    assert python("--steps", 8, "--resume", first).returncode == 0 and step_of(first) == 8
    assert python("--steps", 5, "--out", first, "--overwrite").returncode == 0 and step_of(first) == 5


def test_a_worker_whose_launcher_is_gone_writes_nothing(tmp_path):
    assert main(["compile", str(FAULTY), "-o", str(tmp_path)]) == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run([sys.executable, str(tmp_path / "train.py"), "--out", str(tmp_path), "--quiet",
                           "--launched-by", str(dead.pid)], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 3 and proc.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_small_programs_stay_in_step():
    """faulty.mlo is small.mlo with more functions: the tests above rely on it."""
    small = (SMALL.read_text().replace("import small", "import faulty")
             .replace("program small_reweighting", "program faulty_reweighting"))
    assert small == FAULTY.read_text()
    assert shutil.which(sys.executable)
