"""Issue 22 item 14, the experiments side: a `python train.py` run is listed under the
program's name; a failed sweep point shows the error its run reported; `mloc plot` draws a
run that has one evaluation (in the terminal and through matplotlib)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent
DIRECTIONS = HERE / "directions.mlo"
FAULTY = HERE.parent / "run" / "faulty.mlo"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(*argv, timeout=600, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=timeout)


def mloc(*argv, **kw) -> subprocess.CompletedProcess:
    return run("-m", "mloc", *argv, **kw)


def test_a_run_of_the_compiled_train_py_is_listed_under_the_programs_name(tmp_path):
    build = tmp_path / "build"
    proc = mloc("compile", DIRECTIONS, "-o", build)
    assert proc.returncode == 0, proc.stderr
    proc = run(build / "train.py", "--steps", "10", "--quiet", "--threads", "1", "--out", tmp_path / "runs" / "a",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = mloc("runs", tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    # train.py tries no evaluation before training (mloc compile did): steps 5 and 10 read acc 0.1, 0.5
    assert re.split(r"\s{2,}", proc.stdout.splitlines()[1])[1:5] == ["directions", "-", "10/10",   # was `train`
                                                                     "acc=0.5@10 (max)"]
    program = json.loads((tmp_path / "runs" / "a" / "config.json").read_text())["run"]["program"]
    assert program["name"] == "directions" and program["file"] == str(build / "train.py")
    assert program["directions"] == {"acc": "max", "dist": "min"} and program["set"] == []


def test_a_failed_sweep_point_shows_the_error_its_run_reported(tmp_path):
    """A point whose loss raises (E702 at a step, after training began) and one the checker
    refuses (E305): each is shown with its diagnostic's headline and location, not with the
    last lines of its output (which left the headline out)."""
    out = tmp_path / "sweep"
    proc = mloc("sweep", FAULTY, "--set", "weights.loss=lib.ce_raising(net, batch, after=3)",
                "--set", "net.optimizer.lr=0.1,-1", "--steps", "10", "--jobs", "2", "--out", out)
    assert proc.returncode == 1, proc.stderr
    reports = {}
    for block in re.split(r"\n(?=\[\d/2\] )", proc.stderr):
        head, _, rest = block.partition("\n")
        if "failed (exit 1)" in head:
            reports[head.split()[1].rstrip(":")] = [line.strip() for line in rest.splitlines()
                                                   if line.startswith("    ")]
    raised, refused = reports["00-loss=lib.ce_raising_net,_batch,_after=3_,lr=0.1"], \
        reports["01-loss=lib.ce_raising_net,_batch,_after=3_,lr=-1"]
    assert re.fullmatch(r"error\[E702\]: the program's code raised ValueError during step \d+: labels out of "
                        r"range \(rank 0\)", raised[0])
    assert raised[-2].startswith("--> ") and raised[-2].endswith('in ce_raising: raise ValueError(f"labels out of '
                                                                 'range (rank {_rank()})")')
    assert raised[-1].startswith("= help: fix the code at the last location above")
    assert refused[0] == "error[E305]: `lr` of `sgd` must be greater than 0, got -1"
    assert refused[1:] == ["--> --set:1:25", f"= note: `net.optimizer.lr` in {FAULTY}, as set for this command"]


def _one_evaluation(tmp_path, mloc_here) -> Path:
    """A 5-step run of directions.mlo: its evaluations run once, at step 5."""
    folder = tmp_path / "one"
    proc = mloc_here("run", DIRECTIONS, "--steps", "5", "--quiet", "--threads", "1", "--out", folder)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "eval" and r["eval"] == "acc"] == [5]
    return folder


def test_plot_draws_a_run_with_one_evaluation_in_the_terminal(tmp_path, mloc_here):
    """The point is drawn in the middle column with its step, 5, under it; the axis read
    5 to 6 before (a step the run never had), the point at its left edge."""
    folder = _one_evaluation(tmp_path, mloc_here)
    proc = mloc_here("plot", folder, "--metric", "eval/acc")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    grid = [line.split("|", 1)[1] for line in lines if "|" in line]
    marks = [(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "*"]
    assert len(marks) == 1 and marks[0][1] == (len(grid[0]) - 1) // 2
    axis = next(line for line in lines if line.endswith("(step)"))
    assert axis.split() == ["5", "(step)"]
    offset = len(lines[1].split("|", 1)[0]) + 1               # where the grid's columns start
    assert axis.index("5") - offset in (marks[0][1] - 1, marks[0][1])


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_plot_draws_a_run_with_one_evaluation_through_matplotlib(tmp_path, mloc_here):
    """A line through one point draws nothing: the evaluation gets a marker, drawn at the
    point and in the legend (SVG `<use>` of a marker in the first color, C0 = #1f77b4)."""
    folder = _one_evaluation(tmp_path, mloc_here)
    svg = tmp_path / "acc.svg"
    proc = mloc_here("plot", folder, "--metric", "eval/acc", "-o", svg)
    assert proc.returncode == 0, proc.stderr
    uses = re.findall(r'<use xlink:href="#m[0-9a-f]+" x="[-\d.]+" y="[-\d.]+" style="fill: #1f77b4', svg.read_text())
    assert len(uses) == 2
