"""`mloc plot`, `mloc runs`, `mloc sweep` (docs: README "Logging and experiments")."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.cli.experiments import load_run, mode_by_name
from mloc.cli.sweep import grid, split_values
from mloc.runtime.files.runfolder import Choice, RunFolder
from tests.conftest import ROOT

SMALL = Path(__file__).resolve().parents[1] / "run" / "small.mlo"


def _record(kind, step, **kw):
    return json.dumps({"kind": kind, "step": step, "time": 1.0, "problem": kw.pop("problem", "*"), **kw})


def fake_run(folder: Path, accs, steps=None, finished=True, lock=None, set_=()):
    """A run folder as mloc writes one: eval accuracies every 10 steps, losses, a summary."""
    folder.mkdir(parents=True)
    lines = []
    for i, acc in enumerate(accs, 1):
        lines += [_record("train", 10 * i, problem="net", loss=1.0 / i, lr=0.1, loss_steps=10),
                  _record("eval", 10 * i, eval="acc", value=acc)]
    if finished:
        lines.append(_record("summary", 10 * len(accs), final={"acc": accs[-1]}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    config = {"run": {"program": {"file": "/x/small.mlo", "set": list(set_)}, "steps": steps or 10 * len(accs)}}
    (folder / "config.json").write_text(json.dumps(config))
    if lock is not None:
        (folder / ".lock").write_text(f"{lock} -\n")
    return folder


def test_grid_values_split_at_top_level_commas_only():
    assert split_values("neumann(iters=3, alpha=0.1),sama(eps=0.01)") == ["neumann(iters=3, alpha=0.1)",
                                                                         "sama(eps=0.01)"]
    assert split_values("[1, 2],'a,b',3") == ["[1, 2]", "'a,b'", "3"]
    assert grid(["a.lr=0.1,0.05", "b->a.hypergrad=cg(iters=2, x=1)"]) == [
        ("a.lr=0.1", "b->a.hypergrad=cg(iters=2, x=1)"), ("a.lr=0.05", "b->a.hypergrad=cg(iters=2, x=1)")]


def test_best_and_status_from_the_folder(tmp_path):
    done = load_run(fake_run(tmp_path / "a", [0.5, 0.9, 0.7]))
    assert done.best() == {"metric": "acc", "mode": "max", "declared": False, "step": 20, "value": 0.9}
    assert done.final() == {"acc": 0.7} and done.status() == "finished" and done.steps_done == 30
    assert load_run(fake_run(tmp_path / "b", [0.5], steps=100, finished=False)).status() == "crashed"
    stale = fake_run(tmp_path / "c", [0.5], finished=False, lock=os.getpid())   # a killed run's .lock: not held
    assert load_run(stale).status() == "crashed"
    with RunFolder(Choice(stale)):
        assert load_run(stale).status() == "running"
    assert mode_by_name("val_loss") == "min" and mode_by_name("acc") == "max" and mode_by_name("score") is None
    (tmp_path / "a" / "summary.json").write_text(json.dumps(
        {"status": "stopped_early", "steps_done": 30, "best": {"metric": "acc", "mode": "max", "step": 10, "value": 0.95},
         "final": {"acc": 0.7}}))
    assert load_run(tmp_path / "a").status() == "stopped_early" and load_run(tmp_path / "a").best()["step"] == 10


def test_runs_lists_every_run_under_a_folder(tmp_path, capsys):
    fake_run(tmp_path / "small" / "1", [0.5, 0.9], set_=["net.optimizer.lr=0.05"])
    fake_run(tmp_path / "small" / "2", [0.4], steps=100, finished=False)
    os.symlink("2", tmp_path / "small" / "latest")
    assert main(["runs", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines[0].split() == ["RUN", "PROGRAM", "SET", "STEPS", "BEST", "STATUS"]
    assert len(lines) == 3 and printed.err.startswith("(by name: ")   # `latest` is not listed twice
    assert lines[1].split() == [str(tmp_path / "small" / "1"), "small", "net.optimizer.lr=0.05", "20/20",
                                "acc=0.9@20", "(max,", "by", "name)", "finished"]
    assert lines[2].split()[-6:] == ["10/100", "acc=0.4@10", "(max,", "by", "name)", "crashed"]
    assert main(["runs", str(tmp_path / "nothing")]) == 2


def test_plot_in_the_terminal_and_errors(tmp_path, capsys):
    a = fake_run(tmp_path / "a", [0.5, 0.9, 0.7])
    b = fake_run(tmp_path / "b", [0.4, 0.6, 0.8])
    assert main(["plot", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("losses") and "learning rates" in out and "evaluations" in out
    assert "a: eval/acc" in out and "b: eval/acc" in out                  # one legend entry per run
    assert main(["plot", str(a), "--metric", "nope"]) == 2
    assert "the curves are: eval/acc, net/loss, net/lr" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert main(["plot", str(a), "-o", str(tmp_path / "x.txt")]) == 2


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plot_writes_a_figure(tmp_path, suffix, magic):
    a = fake_run(tmp_path / "a", [0.5, 0.9, 0.7])
    b = fake_run(tmp_path / "b", [0.4, 0.6, 0.8])
    out = tmp_path / f"curves{suffix}"
    assert main(["plot", str(a), str(b), "-o", str(out), "--metric", "eval/acc", "--metric", "loss"]) == 0
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 5000
    if suffix == ".svg":
        assert b"a: eval/acc" in data and b"b: net/loss" in data


def test_sweep_runs_each_point_and_survives_a_failing_one(tmp_path):
    """Two points in parallel, one thread each; the second's learning rate is refused by the
    checker (exit 1): reported, the other still tabulated; the sweep's exit code is 1."""
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "mloc", "sweep", str(SMALL), "--set", "net.optimizer.lr=0.1,-1",
                           "--seeds", "3", "--jobs", "2", "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "01-lr=-1,seed=3: failed (exit 1)" in proc.stderr and "1 of 2 runs finished" in proc.stderr
    table = proc.stdout.splitlines()
    assert table[0].split()[:2] == ["SET", "RUNS"] and table[0].split()[2:] == ["final", "accuracy", "best", "accuracy", "(max,", "by",
                                                                                     "name)"]
    assert table[1].split()[:2] == ["net.optimizer.lr=0.1", "1/1"] and table[2].split()[:2] == ["net.optimizer.lr=-1", "0/1"]
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["threads"] == 1 and summary["seeds"] == [3]
    point = summary["points"][0]
    ran = load_run(out / point["runs"][0])
    assert ran.status() == "finished" and ran.steps_done == 2 and ran.config["seed"] == 3 and ran.config["threads"] == 1
    assert point["final"] == {k: [v] for k, v in ran.final().items()}
