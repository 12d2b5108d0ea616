"""`mloc runs`: an interrupted run says so (and whether it can be resumed), and a run is
listed under its program's name (README "Logging and experiments")."""

from __future__ import annotations

import json

from mloc.cli import main
from mloc.cli.experiments import load_run
from tests.experiments.test_experiments_cli import fake_run


def _summary(folder, **kw):
    (folder / "summary.json").write_text(json.dumps({"steps_done": 10, "best": None, "final": {}, **kw}))


def test_an_interrupted_run_is_listed_as_interrupted(tmp_path):
    stopped = fake_run(tmp_path / "a", [0.5], steps=100, finished=False)
    _summary(stopped, status="interrupted")
    (stopped / "checkpoint.pt").write_bytes(b"")
    assert load_run(stopped).status() == "interrupted (resumable)"
    aborted = fake_run(tmp_path / "b", [0.5], steps=100, finished=False)
    _summary(aborted, status="failed", error="interrupted")         # a second Ctrl-C, no checkpoint
    assert load_run(aborted).status() == "interrupted"
    failed = fake_run(tmp_path / "c", [0.5], steps=100, finished=False)
    _summary(failed, status="failed", error="NonFiniteError: ...")
    assert load_run(failed).status() == "failed"


def test_a_run_is_listed_under_its_programs_name(tmp_path, capsys):
    folder = fake_run(tmp_path / "digits_hpo" / "1", [0.5])
    config = json.loads((folder / "config.json").read_text())
    config["run"]["program"]["name"] = "digits_hpo"
    (folder / "config.json").write_text(json.dumps(config))
    fake_run(tmp_path / "old" / "1", [0.5])                          # written before the name was recorded
    assert main(["runs", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[1] for r in rows] == ["digits_hpo", "small"]


def test_a_pruned_search_trial_is_listed_as_pruned_not_resumable(tmp_path):
    sweep = tmp_path / "sweep"
    trials = []
    for name, state in (("00-a", "complete"), ("01-b", "pruned"), ("02-c", "interrupted")):
        run = fake_run(sweep / name, [0.5], steps=100, finished=False)
        _summary(run, status="interrupted")
        (run / "checkpoint.pt").write_bytes(b"")
        trials.append({"number": len(trials), "name": name, "state": state,
                       **({"pruned_at": 40} if state == "pruned" else {})})
    (sweep / "sweep.json").write_text(json.dumps({"trials": trials}))
    assert load_run(sweep / "01-b").status() == "pruned at step 40"
    assert load_run(sweep / "02-c").status() == "interrupted (resumable)"   # the sweep itself was stopped
    (sweep / "sweep.json").write_text("{not json")                          # unreadable: the run's own files
    assert load_run(sweep / "01-b").status() == "interrupted (resumable)"


def test_a_run_resumed_for_more_steps_is_listed_with_the_steps_it_was_last_given(tmp_path, capsys):
    from tests.conftest import ROOT
    out = tmp_path / "r"
    small = str(ROOT / "tests" / "run" / "small.mlo")
    assert main(["run", small, "--steps", "3", "--quiet", "--out", str(out)]) == 0
    assert main(["run", small, "--resume", str(out), "--steps", "6", "--quiet"]) == 0
    run = load_run(out)
    assert (run.steps_done, run.config.get("steps"), run.status()) == (6, 6, "finished")
    capsys.readouterr()
    assert main(["runs", str(tmp_path)]) == 0
    assert "6/6" in capsys.readouterr().out
