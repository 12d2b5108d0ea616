"""Run-folder files mloc cannot read (issue 23 item 8): `mloc runs` skips the folder with a
note naming the file, `mloc plot` is exit 2 naming it; never exit 101. docs/reliability.md
("What a run folder may contain")."""

from __future__ import annotations

import json

import pytest

from mloc.cli import main
from tests.experiments.test_experiments_cli import fake_run


def _append(name, record):
    def spoil(folder):
        with open(folder / name, "a") as f:
            f.write(json.dumps(record) + "\n")
    return spoil


def _write(name, text):
    return lambda folder: (folder / name).write_text(text)


def _non_utf8(folder):
    data = (folder / "metrics.jsonl").read_bytes()
    (folder / "metrics.jsonl").write_bytes(data[:40] + b"\xff\xfe" + data[40:])


HOSTILE = {
    "metrics.jsonl": {
        "non_utf8": _non_utf8,
        "step_null": _append("metrics.jsonl", {"kind": "train", "step": None, "problem": "net", "loss": 1.0}),
        "step_string": _append("metrics.jsonl", {"kind": "train", "step": "x", "problem": "net", "loss": 1.0}),
        "eval_name_list": _append("metrics.jsonl", {"kind": "eval", "step": 30, "eval": ["a"], "value": 1.0}),
    },
    "config.json": {
        "run_string": _write("config.json", '{"run": "x"}'),
        "resumes_int": _write("config.json", '{"run": {"steps": 20}, "resumes": 3}'),
        "program_string": _write("config.json", '{"run": {"program": "x", "steps": 20}}'),
        "set_of_numbers": _write("config.json", '{"run": {"program": {"set": [1]}, "steps": 20}}'),
    },
    "summary.json": {
        "best_metric_list": _write("summary.json", '{"best": {"metric": ["acc"], "mode": "max", "value": 1}}'),
        "best_without_value": _write("summary.json", '{"best": {"metric": "acc", "mode": "max", "value": "-"}}'),
    },
}
CASES = [pytest.param(file, spoil, id=f"{file}-{name}") for file, d in HOSTILE.items() for name, spoil in d.items()]


@pytest.mark.parametrize("file, spoil", CASES)
def test_runs_skips_an_unreadable_folder_with_a_note(tmp_path, capsys, file, spoil):
    fake_run(tmp_path / "good", [0.5, 0.9])
    spoil(fake_run(tmp_path / "bad", [0.5, 0.9]))
    assert main(["runs", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert str(tmp_path / "good") in captured.out and str(tmp_path / "bad") not in captured.out
    assert f"skipped {tmp_path / 'bad'}" in captured.err and str(tmp_path / "bad" / file) in captured.err


@pytest.mark.parametrize("file, spoil", CASES)
def test_plot_names_the_unreadable_file(tmp_path, capsys, file, spoil):
    spoil(fake_run(tmp_path / "bad", [0.5, 0.9]))
    assert main(["plot", str(tmp_path / "bad")]) == 2
    assert f"cannot read {tmp_path / 'bad' / file}" in capsys.readouterr().err
    good = fake_run(tmp_path / "good", [0.5, 0.9])                 # several: the readable ones are drawn
    assert main(["plot", str(good), str(tmp_path / "bad")]) == 0
    assert f"skipped {tmp_path / 'bad'}" in capsys.readouterr().err


def test_plot_and_runs_do_not_read_metrics_csv(tmp_path, capsys):
    """The CSV logger's file is for other tools: a byte that is not UTF-8 there changes
    nothing for `mloc plot` and `mloc runs`, which read metrics.jsonl (its resume check:
    tests/hostile/test_resume_folder_files.py)."""
    run = fake_run(tmp_path / "run", [0.5, 0.9])
    (run / "metrics.csv").write_bytes(b"step,time,kind,name,value\n10,1.0,train,net/loss,\xff\n")
    assert main(["plot", str(run)]) == 0
    assert main(["runs", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert str(run) in captured.out and "skipped" not in captured.err
