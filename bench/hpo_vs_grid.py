"""docs/programs.md's table for hpo.mlo against hpo_grid.mlo, read from the sweeps' folders.

    python3 bench/hpo_vs_grid.py LABEL=SWEEP[,SWEEP...] ...
    e.g. python3 bench/hpo_vs_grid.py cg=runs/p3/cg grid=runs/p3/grid \\
             optuna=runs/p3/optuna0,runs/p3/optuna1,runs/p3/optuna2

Each group's runs are grouped by their seed (``config.json``). A run that evaluates
``val_loss`` (the baseline) is a candidate: per seed the finished run whose best
``val_loss`` is lowest is chosen, scored by its ``test_loss`` at that step (the model
``checkpoint best on min val_loss`` keeps). A run without (``hpo.mlo``) is scored by its
final ``test_loss``. Printed per group: the test loss as mean ± sample std over seeds, each
seed's choice, the outer steps its runs did (a pruned run's included) and their training
seconds (the runs' ``summary`` records, start-up excluded).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _evals(records: list[dict], name: str) -> list[tuple[int, float]]:
    return [(r["step"], r["value"]) for r in records
            if r.get("kind") == "eval" and r.get("eval") == name and r.get("value") is not None]


def _runs(sweeps: list[Path]) -> dict[int, list[Path]]:
    by_seed: dict[int, list[Path]] = {}
    for sweep in sweeps:
        for run in sorted(p for p in sweep.iterdir() if (p / "config.json").is_file()):
            seed = json.loads((run / "config.json").read_text())["run"]["seed"]
            by_seed.setdefault(seed, []).append(run)
    return by_seed


def _choose(runs: list[Path]) -> tuple[float, str]:
    """(test loss, what was chosen) for one seed's runs."""
    finished = [r for r in runs if json.loads((r / "summary.json").read_text()).get("status") == "finished"]
    scored = []
    for run in finished:
        records = _records(run)
        vals = _evals(records, "val_loss")
        if not vals:
            return _evals(records, "test_loss")[-1][1], f"{run.name}: final"
        step, val = min(vals, key=lambda sv: (sv[1], sv[0]))
        scored.append((val, dict(_evals(records, "test_loss"))[step], f"{run.name} @ {step}: val {val:.4f}"))
    val, test, what = min(scored)
    return test, what


def group(label: str, sweeps: list[Path]) -> str:
    lines, tests = [], []
    for seed, runs in sorted(_runs(sweeps).items()):
        test, what = _choose(runs)
        tests.append(test)
        steps = sum(json.loads((r / "summary.json").read_text()).get("steps_done", 0) for r in runs)
        seconds = sum(r.get("seconds", 0) for run in runs for r in _records(run) if r.get("kind") == "summary")
        lines.append(f"  seed {seed}: test {test:.4f} ({what}); {len(runs)} runs, {steps} outer steps, "
                     f"{seconds:.1f} s training")
    std = statistics.stdev(tests) if len(tests) > 1 else 0.0
    return f"{label}: test loss {statistics.fmean(tests):.4f} ± {std:.4f}\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        label, _, dirs = arg.partition("=")
        print(group(label, [Path(d) for d in dirs.split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
