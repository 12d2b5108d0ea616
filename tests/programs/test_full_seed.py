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

Each row's `bound` and `margin` were measured here (2026-12-02; maml and imaml 2026-12-03; torch 2.13.0+cpu, the
program's seeds 0, 1, 2, on the loaded 2-core machine) with

    mloc run programs/NAME.mlo --seed S --threads 1 --compile off --out DIR

the metric read from DIR/metrics.jsonl's summary record; the comment beside each row gives
the three values, the untrained one, and why the bound leaves the room it does. Adding a
program is adding a row. darts, longtail (with longtail_baseline) and lbi have their own
full-seed tests: tests/test_darts.py, tests/test_longtail.py, tests/test_lbi.py.

Cost, in CPU seconds (user + system, `/usr/bin/time`) of each full run: hpo 13, hpo_grid 5,
interlock4 8, interlock 8, shampoo_reweighting 8, maml 16, data_reweighting 18; imaml about
33 and trilevel about 75 (per-step cost from runs of 50 and 150, and 100 and 300 steps).
About 185 s in all, plus a few seconds per row for the untrained evaluation: under two
minutes of the slow tier on two cores. Wall times on the loaded machine were 4 to 24 times
these (trilevel's seed 2 ran past 30 minutes at a load of 20).
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
    margin: float | None            # ... and this much better than the untrained model's (None:
                                    # the program does not measurably learn; its comment says so)
    set: tuple[str, ...] = ()       # --set overrides of the run (and of the untrained model)
    needs: tuple[str, ...] = ()     # modules the program's Python imports (skipped without)

    def better_than(self, a: float, b: float) -> bool:
        return a <= b if self.better == "min" else a >= b

    def improvement(self, final: float, untrained: float) -> float:
        return untrained - final if self.better == "min" else final - untrained


FULL_SEEDS = (
    # final test loss, seeds 0 1 2: 0.4047 0.4047 0.4051 (the data are fixed by the module and both
    # problems are convex: the seeds agree to 1e-4); untrained 0.6977. The bound stays below
    # the best shared decay's 0.4712 (docs/programs.md), so a pass still says the per-feature
    # decays beat the grid.
    FullSeed("hpo", "test_loss", "min", bound=0.43, margin=0.2),
    # the baseline at the decay the grid search selects (docs/programs.md: log_decay=1; the
    # program's own -2 overfits, final test loss 0.7772 against 0.6977 untrained). Final test
    # loss 0.4929 0.4929 0.4929; untrained 0.6977. Bound: 0.017 of room, the seeds identical.
    FullSeed("hpo_grid", "test_loss", "min", bound=0.51, margin=0.1, set=("model.loss.log_decay=1",)),
    # final test accuracy 0.9600 0.9650 0.9300 (400 test images); untrained 0.095. Bound: the
    # worst seed less the spread, 0.93 - 0.035.
    FullSeed("interlock4", "accuracy", "max", bound=0.89, margin=0.5, needs=("sklearn",)),
    # stage3's training loss over the last log interval 1e-4 in all three (the synthetic digits
    # are memorised); untrained (first step) 2.30. Bound: the loss at step 30 of seed 0, 0.046.
    FullSeed("interlock", "stage3/loss", "min", bound=0.05, margin=2.0),
    # final test accuracy 0.9880 0.9905 0.9920; untrained 0.092. Bound: 3.8 points below the
    # worst, as the accuracy moves by up to 2.6 points between evaluations within a run
    # (0.983, 0.9625, 0.988 at steps 100, 200, 300 of seed 0).
    FullSeed("shampoo_reweighting", "acc", "max", bound=0.95, margin=0.5),
    # final adapted error (query MSE after the 5 inner steps, on held-out tasks) 0.778 0.811 0.841
    # (2026-12-03); untrained 3.827 3.874 4.124. The evaluation moves by up to 0.06 between the
    # last two evaluations of a run (seed 2: 0.901, 0.841): bound 1.0, the worst plus 0.16.
    FullSeed("maml", "adapted_error", "min", bound=1.0, margin=2.0),
    # final test accuracy 0.893 0.8295 (seeds 0 1, here); docs/programs.md's sama/SGD row (the same
    # runs): 0.89 0.83 0.93; untrained 0.068. Bound: the worst seed less the spread, 0.83 - 0.10.
    FullSeed("data_reweighting", "acc", "max", bound=0.73, margin=0.5),
    # final test accuracy 0.9100 0.8840 and 0.9235 (seed 2 at step 1500 of 2000: the run hit the
    # 30-minute limit on the loaded machine); untrained 0.104. It falls from 0.94-0.96 at step
    # 500 as the classifier fits the noisy labels. Bound: the worst less the spread, 0.884 - 0.026.
    FullSeed("trilevel", "accuracy", "max", bound=0.85, margin=0.5),
    # final adapted error 2.069 1.826 2.159 (2026-12-03, λ = 10); untrained 3.934 3.969 4.255. It
    # falls by 0.4-0.5 between the last two evaluations (seed 0: 2.570, 2.069): the run ends
    # still learning. Bound: the worst plus the spread, 2.159 + 0.333.
    FullSeed("imaml", "adapted_error", "min", bound=2.5, margin=1.2),
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
    untrained = _untrained(row) if row.margin is not None else None
    assert row.better_than(final, row.bound), f"{row.metric} = {final:.4g}, measured level {row.bound}"
    if row.margin is None:
        return
    assert row.improvement(final, untrained) >= row.margin, \
        f"{row.metric}: {final:.4g} after training, {untrained:.4g} untrained; needs {row.margin} better"
