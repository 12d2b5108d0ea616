"""Issue 22 item 3: `mloc runs`, `mloc sweep` and `sweep.json` rank a metric's values in
its direction: the one the program declares (`checkpoint best on max acc`, `stop when min
dist ...`), else the name rule (`test_loss`: min), else none (`score`: no best). Before,
`Run.best()` negated a min-metric and then took the minimum, so "best" was the worst value.

The reference for every best value is the run's own `metrics.jsonl` (the largest or the
smallest value recorded), not the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.runtime.run.records import read_metrics
from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent
DIRECTIONS = HERE / "directions.mlo"
HPO = ROOT / "programs" / "hpo.mlo"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def mloc(*argv, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mloc", *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=timeout)


def recorded(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    return [(r["step"], r["value"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "eval" and r["eval"] == metric]


def columns(table_line: str) -> list[str]:
    """The cells of a table line (cells are separated by two spaces or more)."""
    import re
    return re.split(r"\s{2,}", table_line.strip())


def test_sweep_ranks_each_metric_in_its_declared_or_named_direction(tmp_path):
    """A max metric (acc, declared), a min one (dist, declared by `stop when min dist`: its
    name says nothing), one min by its name (test_loss) and one that nothing ranks (score)."""
    out = tmp_path / "sweep"
    proc = mloc("sweep", DIRECTIONS, "--seeds", "0", "--steps", "20", "--jobs", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header, row = columns(lines[0]), columns(lines[1])
    run_dir = out / json.loads((out / "sweep.json").read_text())["points"][0]["runs"][0]
    acc, dist, loss = (recorded(run_dir, m) for m in ("acc", "dist", "test_loss"))
    best = {h.split()[1]: float(c.split(" ± ")[0]) for h, c in zip(header, row) if h.startswith("best ")}
    assert best == {"acc": max(v for _, v in acc), "dist": min(v for _, v in dist),
                    "test_loss": min(v for _, v in loss)} == {"acc": 0.9, "dist": 1.0, "test_loss": 0.3}
    assert header == ["SET", "RUNS", "final acc", "final dist", "final test_loss", "final score",
                      "best acc (max)", "best dist (min)", "best test_loss (min, by name)"]
    assert "(by name: min for a name holding loss" in proc.stdout           # the rule, under the table
    assert "(no best for score: neither the program nor the name says" in proc.stdout
    point = json.loads((out / "sweep.json").read_text())["points"][0]
    assert point["best"] == {"acc": [0.9], "dist": [1.0], "test_loss": [0.3]}
    assert point["direction"] == {"acc": {"mode": "max", "declared": True}, "dist": {"mode": "min", "declared": True},
                                  "test_loss": {"mode": "min", "declared": False}}
    assert point["final"] == {"acc": [0.6], "dist": [4.0], "test_loss": [0.6], "score": [4.0]}

    # mloc runs: the declared metric's best, also once summary.json is gone (a crashed run):
    # the direction comes from config.json then
    rows = []
    for _ in range(2):
        proc = mloc("runs", out)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr       # no rule was used
        rows.append(columns(proc.stdout.splitlines()[1])[4])
        (run_dir / "summary.json").unlink(missing_ok=True)
    assert rows == ["acc=0.9@10 (max)", "acc=0.9@10 (max)"]


@pytest.mark.slow
def test_the_issues_hpo_sweep_reports_the_lowest_test_loss_as_best(tmp_path):
    """The issue's command (one seed): hpo.mlo declares no direction for test_loss; its best
    is the lowest value recorded (0.7275 at step 10, 0.6704 at step 20: the final one), where
    it was the highest."""
    out = tmp_path / "sweep"
    proc = mloc("sweep", HPO, "--seeds", "0", "--steps", "20", "--out", out)
    assert proc.returncode == 0, proc.stderr
    header, row = columns(proc.stdout.splitlines()[0]), columns(proc.stdout.splitlines()[1])
    run_dir = out / "00-seed=0"
    values = recorded(run_dir, "test_loss")
    assert len(values) == 2 and values[1][1] < values[0][1]                 # the loss falls: best is final
    low = min(v for _, v in values)
    assert row[2] == row[3] == f"{low:.4f} ± 0.0000"
    assert header[2:] == ["final test_loss", "best test_loss (min, by name)"]
    proc = mloc("runs", out)
    assert proc.returncode == 0, proc.stderr
    cells = columns(proc.stdout.splitlines()[1])
    assert cells[4].split()[0] == f"test_loss={low:.4g}@20"
    assert cells[1:] == ["weight_decay_hpo", "-", "20/20", f"test_loss={low:.4g}@20 (min, by name)", "finished"]
    assert proc.stderr.startswith("(by name: min for a name holding loss")


def test_runs_shows_no_best_for_a_metric_nothing_ranks(tmp_path, capsys):
    """`score`: no declaration, and the name rule says nothing: no best (it was the largest)."""
    run = tmp_path / "a"
    run.mkdir()
    records = [{"kind": "eval", "step": 10 * i, "time": 1.0, "problem": "*", "eval": "score", "value": v}
               for i, v in enumerate([0.5, 0.9, 0.7], 1)] + \
              [{"kind": "summary", "step": 30, "time": 1.0, "problem": "*", "final": {"score": 0.7}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "config.json").write_text(json.dumps({"run": {"program": {"name": "p", "set": []}, "steps": 30}}))
    assert main(["runs", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert columns(printed.out.splitlines()[1])[4:] == ["-", "finished"]
    assert printed.err == ""                                                 # no rule was used
