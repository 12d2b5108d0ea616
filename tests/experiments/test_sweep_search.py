"""`mloc sweep --search random|optuna` (issue 27, "Search beyond grids"): ranges in `--set`
checked when the command line is read, random draws that are the same in every process,
a random sweep end to end with its table and `sweep.json`, the objective a model-based
search optimizes, and Optuna's pruner stopping a trial's run through SIGINT.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.cli.output import UsageError
from mloc.cli.search import axes, random_points
from mloc.cli.search_objective import Objective, objective_of
from mloc.cli.sweep_folder import admit
from tests.conftest import ROOT
from tests.run.helpers import SMALL, default_signals, mloc

HPO, GRID = ROOT / "programs" / "hpo.mlo", ROOT / "programs" / "hpo_grid.mlo"
LR = "net.optimizer.lr"


def test_each_range_is_read_with_its_bounds_and_a_grid_stays_a_grid():
    found = axes([f"{LR}=loguniform(1e-3, 1e-1)", "a.b=uniform(-1,2)", "c.d=randint(1, 4)", "e.f=int(2,2)",
                  "g.h=choice(sgd(lr=0.1, momentum=0.9), adam(lr=1e-3))", "i.j=0.1,0.2", "k.l=neumann(iters=3, alpha=0.1)"])
    assert [(a.kind, a.low, a.high) for a in found[:5]] == [("loguniform", 1e-3, 1e-1), ("uniform", -1.0, 2.0),
                                                            ("int", 1, 4), ("int", 2, 2), ("choice", 0.0, 0.0)]
    assert found[4].values == ("sgd(lr=0.1, momentum=0.9)", "adam(lr=1e-3)")
    assert (found[5].kind, found[5].values) == ("grid", ("0.1", "0.2"))
    assert (found[6].kind, found[6].values) == ("grid", ("neumann(iters=3, alpha=0.1)",))


@pytest.mark.parametrize("value, message, fix", [
    ("uniform(1,0)", "uniform() needs LOW < HIGH, got 1 and 0", "uniform(LOW, HIGH)"),
    ("uniform(1,1)", "uniform() needs LOW < HIGH", "uniform(LOW, HIGH)"),
    ("loguniform(0,1)", "loguniform() needs a positive lower bound, got 0", "0 < LOW < HIGH"),
    ("loguniform(-1,1)", "needs a positive lower bound", "0 < LOW < HIGH"),
    ("int(1.5,3)", "int() takes two integers, got 1.5, 3", "int(LOW, HIGH)"),
    ("int(3,1)", "int() needs LOW <= HIGH, got 3 and 1", "both included"),
    ("uniform(1)", "uniform() takes two numbers, got 1 argument", "uniform(LOW, HIGH)"),
    ("uniform(0,1,2)", "takes two numbers, got 3 arguments", "uniform(LOW, HIGH)"),
    ("uniform(a,b)", "uniform() takes two numbers, got a, b", "uniform(LOW, HIGH)"),
    ("uniform(0,inf)", "takes finite bounds", "uniform(LOW, HIGH)"),
    ("choice()", "choice() needs values", "choice(V1, V2, ...)"),
    ("choice(1,,2)", "choice() needs values separated by single commas", "choice(V1, V2, ...)"),
    ("loguniform(1e-3,1e-1),0.5", "a range must be the flag's only value", "a --set of its own"),
])
def test_a_bad_range_is_a_usage_error_naming_the_flag_and_the_fix(tmp_path, capsys, value, message, fix):
    with pytest.raises(UsageError) as e:
        axes([f"{LR}={value}"])
    assert str(e.value).startswith(f"--set {LR}={value}: ") and message in str(e.value), str(e.value)
    assert fix in e.value.help
    code = main(["sweep", str(SMALL), "--search", "random", "--trials", "2", "--set", f"{LR}={value}",
                 "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and fix in err and not (tmp_path / "s").exists()


@pytest.mark.parametrize("argv, message", [
    ([f"--set={LR}=loguniform(1e-3,1e-1)"], "a range is drawn by a search, not walked by a grid"),
    (["--search", "random", f"--set={LR}=uniform(0,1)"], "--search random needs --trials N"),
    (["--search", "random", "--trials", "0", f"--set={LR}=uniform(0,1)"], "--search random needs --trials N"),
    (["--trials", "3"], "--trials needs --search random or --search optuna"),
    (["--search", "random", "--trials", "2", "--metric", "acc"], "steer --search optuna"),
    (["--search", "random", "--trials", "2", "--set", "net.optimiser.lr=uniform(0,1)"], "optimiser"),
    (["--search", "random", "--trials", "2", "--search-seed", "-1"], "--search-seed -1: expected an integer"),
    (["--search", "optuna", "--trials", "2", "--prune-after", "-1"], "--prune-after -1: expected a count"),
    (["--search", "optuna", "--trials", "2", "--direction", "up"], "--direction up: expected min or max"),
])
def test_search_flags_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    assert main(["sweep", str(SMALL), *argv, "--out", str(tmp_path / "s")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


DRAW = ("import json, sys; from mloc.cli.search import axes, random_points; "
        "print(json.dumps(random_points(axes(sys.argv[2:]), 5, int(sys.argv[1]))))")
SPACE = [f"{LR}=loguniform(1e-4,1e-1)", "a.b=uniform(-1,1)", "c.d=int(1,100)", "e.f=choice(x,y,z)", "g.h=1,2,3"]


def _draw(seed: int, hashseed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", DRAW, str(seed), *SPACE], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_random_draws_are_the_same_in_every_process_and_lie_in_their_ranges():
    first, second, other = _draw(7, "1"), _draw(7, "12345"), _draw(8, "1")
    assert first == second and first != other
    assert first == [list(p) for p in random_points(axes(SPACE), 5, 7)]
    for point in first:
        values = dict(p.split("=", 1) for p in point)
        assert 1e-4 <= float(values[LR]) <= 1e-1 and -1 <= float(values["a.b"]) <= 1
        assert values["c.d"] == str(int(values["c.d"])) and 1 <= int(values["c.d"]) <= 100
        assert values["e.f"] in "xyz" and values["g.h"] in ("1", "2", "3")
    assert len({p[0] for p in first}) == 5                  # five different learning rates


def test_a_random_sweep_runs_its_draws_and_records_them(tmp_path):
    out = tmp_path / "sweep"
    sets = [f"{LR}=loguniform(1e-3,1e-1)", "net.optimizer.momentum=choice(0.0,0.9)"]
    proc = mloc("sweep", SMALL, "--search", "random", "--trials", 2, "--search-seed", 3, *[a for s in sets for a in ("--set", s)],
                "--steps", 2, "--jobs", 2, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "2 runs (2 random trials (--search-seed 3) x 1 seeds)" in proc.stderr
    points = random_points(axes(sets), 2, 3)
    record = json.loads((out / "sweep.json").read_text())
    assert record["search"] == {"kind": "random", "trials": 2, "seed": 3} and record["set"] == sets
    assert record["status"] == "finished" and [p["set"] for p in record["points"]] == [list(p) for p in points]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["SET", "RUNS"]
    for point, line, row in zip(points, lines[1:3], record["points"]):
        assert line.startswith(" ".join(point)) and line.split()[2] == "1/1"
        config = json.loads((out / row["runs"][0] / "config.json").read_text())["run"]
        assert config["program"]["set"] == list(point) and config["steps"] == 2
        assert row["finished"] == 1 and row["pruned"] == []
        assert row["final"]["accuracy"][0] == pytest.approx(float(line.split()[3]), abs=1e-4)


def test_the_objective_is_the_metric_the_program_ranks_its_runs_by():
    assert objective_of(str(GRID), (), None, None) == Objective("val_loss", "min", "declared")
    assert objective_of(str(HPO), (), None, None) == Objective("test_loss", "min", "by name")
    assert objective_of(str(SMALL), (), None, None) == Objective("accuracy", "max", "by name")
    assert objective_of(str(GRID), (), "test_loss", None) == Objective("test_loss", "min", "by name")
    assert objective_of(str(GRID), (), "score", "max") == Objective("score", "max", "--metric")
    with pytest.raises(UsageError, match="declares no direction for it and its name says none") as e:
        objective_of(str(GRID), (), "score", None)
    assert "add --direction" in e.value.help


def test_a_folder_holding_a_random_sweep_refuses_a_grid_and_another_search(tmp_path):
    definition = {"file": "p.mlo", "set": ["a=uniform(0,1)"], "seeds": [None], "steps": 2,
                  "search": {"kind": "random", "trials": 2, "seed": 0}}
    (tmp_path / "sweep.json").write_text(json.dumps({**definition, "status": "finished"}))
    assert admit(tmp_path, definition, False) == definition
    assert admit(tmp_path, {**definition, "set": None, "search": None, "steps": None, "seeds": None}, True) == definition
    for other, shown in (({"search": None}, "--search: {\"kind\": \"random\""),
                         ({"search": {"kind": "random", "trials": 3, "seed": 0}}, "\"trials\": 3")):
        with pytest.raises(UsageError, match="holds another sweep") as e:
            admit(tmp_path, {**definition, **other}, False)
        assert shown in str(e.value) and "--search" in e.value.help


# --- Optuna ---------------------------------------------------------------------------------

def _trial_run(tmp_path: Path, name: str, values: list[float]) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "step": 10 * (i + 1), "time": 0.0,
                                                           "problem": "*", "eval": "loss", "value": v}) + "\n"
                                               for i, v in enumerate(values)))
    return run


def test_the_median_pruner_stops_a_worse_trial_with_one_sigint_and_records_it(tmp_path):
    """Two trials end with losses 1.0 and 0.5 at step 10; a third, running (a `sleep` as its
    process), reports 3.0 at step 10: the pruner stops it (SIGINT), its trial is pruned."""
    pytest.importorskip("optuna")
    from mloc.cli.output import Output
    from mloc.cli.search_optuna import OptunaSource
    from mloc.cli.sweep_jobs import Job
    saved = []
    source = OptunaSource(axes(["a.b=uniform(0,1)"]), Objective("loss", "min", "--metric"), 3, 0, 2, [],
                          lambda i, point: Job(f"{i:02d}", point, None, tmp_path / f"{i:02d}", []),
                          lambda trials: saved.append(json.loads(json.dumps(trials))), Output("never"))
    for value in (1.0, 0.5):
        job = source.next()
        _trial_run(tmp_path, job.name, [value, value])
        job.code = 0
        source.ended(job)
    job = source.next()
    assert not source.pending() and source.next() is None
    job.proc = subprocess.Popen(["sleep", "60"], preexec_fn=default_signals)
    source.watch([job])                                      # no metrics yet: nothing to report
    assert job.pruned is None and job.proc.poll() is None
    _trial_run(tmp_path, job.name, [3.0])
    source.watch([job])
    assert job.pruned == 10 and job.proc.wait(timeout=10) == -2     # SIGINT
    job.code = 130
    source.ended(job)
    states = [(t["name"], t["state"], t["value"]) for t in saved[-1]]
    assert states == [("00", "complete", 1.0), ("01", "complete", 0.5), ("02", "pruned", None)]
    assert saved[-1][2]["pruned_at"] == 10 and saved[-1][2]["reports"] == {"10": 3.0}
    assert source.best()["name"] == "01"
    assert [t.state.name for t in source.study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]


def test_without_optuna_the_search_is_a_usage_error_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)           # import optuna raises ImportError
    assert main(["sweep", str(SMALL), "--search", "optuna", "--trials", "2", "--set", f"{LR}=uniform(0.01,0.1)",
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--search optuna needs optuna" in err and "pip install 'mloc[optuna]'" in err


@pytest.mark.slow
def test_an_optuna_sweep_prunes_trials_and_a_rerun_tells_them_again(tmp_path):
    """hpo_grid.mlo (its declared objective: min val_loss) over a wide range of weight
    decays (up to e^7: larger ones diverge under its SGD), 6 trials one at a time, pruning after 2: the runs told `pruned` stopped with a
    checkpoint at their pruning step; the rerun runs nothing and prints the same table."""
    pytest.importorskip("optuna")
    out = tmp_path / "sweep"
    argv = ["sweep", GRID, "--search", "optuna", "--trials", 6, "--prune-after", 2, "--set",
            "model.loss.log_decay=uniform(-4,7)", "--steps", 1000, "--jobs", 1, "--out", out]
    first = mloc(*argv, timeout=900)
    assert first.returncode == 0, first.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert record["objective"] == {"metric": "val_loss", "mode": "min", "why": "declared"}
    pruned = [t for t in record["trials"] if t["state"] == "pruned"]
    complete = [t for t in record["trials"] if t["state"] == "complete"]
    assert pruned and len(pruned) + len(complete) == 6, first.stderr
    for t in pruned:
        summary = json.loads((out / t["name"] / "summary.json").read_text())
        assert summary["status"] == "interrupted" and (out / t["name"] / "checkpoint.pt").is_file()
        assert summary["steps_done"] >= t["pruned_at"] and f"{t['name']}: pruned at step {t['pruned_at']}" in first.stderr
        assert f"pruned@{t['pruned_at']}" in next(line for line in first.stdout.splitlines() if t["set"][0] in line)
    for t in complete:
        values = [json.loads(line)["value"] for line in (out / t["name"] / "metrics.jsonl").read_text().splitlines()
                  if '"eval": "val_loss"' in line]
        assert t["value"] == min(values) and len(values) == 20
    best = min(complete, key=lambda t: t["value"])
    assert record["best"]["name"] == best["name"] and f"best trial: {best['name']}: val_loss = " in first.stderr
    again = mloc(*argv, timeout=300)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert again.stderr.count("before; skipped") == 6 and "6 told again from before" in again.stderr


@pytest.mark.slow
def test_a_random_sweep_resumed_runs_the_same_draws_it_had_not_finished(tmp_path):
    out = tmp_path / "sweep"
    argv = ["sweep", SMALL, "--search", "random", "--trials", 3, "--set", f"{LR}=loguniform(1e-3,1e-1)",
            "--steps", 3, "--jobs", 2, "--out", out]
    first = mloc(*argv)
    assert first.returncode == 0, first.stderr
    names = json.loads((out / "sweep.json").read_text())["runs"]
    kept = {n: (out / n / "metrics.jsonl").read_bytes() for n in names[:2]}
    import shutil
    shutil.rmtree(out / names[2])                         # as if the sweep died before its third run
    resumed = mloc("sweep", SMALL, "--resume", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("finished before; skipped") == 2 and f"{names[2]}: done in" in resumed.stderr
    assert {n: (out / n / "metrics.jsonl").read_bytes() for n in names[:2]} == kept
    config = json.loads((out / names[2] / "config.json").read_text())["run"]
    assert config["program"]["set"] == list(random_points(axes([f"{LR}=loguniform(1e-3,1e-1)"]), 3, 0)[2])
    assert resumed.stdout == first.stdout and not math.isnan(float(first.stdout.splitlines()[3].split()[2]))


@pytest.mark.slow
def test_an_interrupted_optuna_sweep_continues_its_stopped_trial_and_asks_for_the_rest(tmp_path):
    """SIGTERM once trial 0 finished and trial 1 is training: trial 1 is left `running` with a
    checkpoint; the rerun tells trial 0 again, resumes trial 1 under its own parameters and
    asks a new point for trial 2 (not trial 0's again: the rerun's sampler is seeded anew)."""
    pytest.importorskip("optuna")
    import signal
    import time
    from tests.run.helpers import popen
    out = tmp_path / "sweep"
    argv = ["sweep", GRID, "--search", "optuna", "--trials", 3, "--set", "model.loss.log_decay=uniform(-4,7)",
            "--steps", 4000, "--jobs", 1, "--out", out]
    proc = popen(*argv)
    end = time.monotonic() + 600
    while not any(d.name.startswith("01-") and (d / "metrics.jsonl").is_file() and (d / "metrics.jsonl").stat().st_size
                  for d in out.glob("0*")):
        assert time.monotonic() < end and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 130
    trials = json.loads((out / "sweep.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["complete", "running"]
    again = mloc("sweep", GRID, "--resume", "--out", out, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{trials[0]['name']}: finished before; skipped" in again.stderr
    assert f"{trials[1]['name']}: done (resumed) in" in again.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert [t["state"] for t in record["trials"]] == ["complete"] * 3
    assert record["trials"][1]["set"] == trials[1]["set"] and record["trials"][2]["number"] == 2
    assert record["trials"][2]["set"] not in (trials[0]["set"], trials[1]["set"])


def test_compile_is_passed_to_each_run(tmp_path):
    """`--compile on|off` reaches every run's command line (auto, the runs' own default,
    adds nothing); a mode that does not exist is refused by the parser."""
    import argparse

    from mloc.cli import sweep
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    sweep.add_command(lambda name, help, fn: subparsers.add_parser(name, help=help))
    program = str(Path(__file__).resolve().parents[1] / "run" / "small.mlo")
    for mode, expected in (("off", ["--compile", "off"]), ("auto", [])):
        args = parser.parse_args(["sweep", program, "--compile", mode])
        argv = sweep._job(args, tmp_path, 0, ("net.optimizer.lr=0.1",), 0, None).argv
        assert [a for a in argv if a in ("--compile", "off", "on", "auto")] == expected
    with pytest.raises(SystemExit):
        parser.parse_args(["sweep", program, "--compile", "maybe"])
