"""The table `mloc sweep` prints, and the same as data for ``sweep.json``."""

from __future__ import annotations

import statistics

from mloc.cli.experiments import BY_NAME, load_run, mode_label, table
from mloc.cli.sweep_jobs import Job


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {std:.4f}"


def sweep_table(jobs: list[Job], by_seed: bool) -> tuple[str, list[dict]]:
    """The table `mloc sweep` prints (a row per grid point or trial: its runs' final and
    best metrics as mean ± sample std over the seeds that finished; a run a search pruned
    counts in RUNS as ``pruned@STEP`` and in no mean) and the same as data. A metric's
    best follows its direction (:meth:`mloc.cli.experiments.Run.best_of`), named in its
    column's header (``best acc (max)``, ``best test_loss (min, by name)``); a metric
    without one has no best column."""
    groups: dict[tuple[str, ...], list[Job]] = {}
    for j in jobs:
        groups.setdefault(j.point, []).append(j)
    summary, metrics, modes = [], [], {}
    for point, members in groups.items():
        ok = [load_run(j.dir) for j in members if j.code == 0]
        finals = [r.final() for r in ok]
        for name in (k for f in finals for k in f):
            if name not in metrics:
                metrics.append(name)
        bests = {m: [b for r in ok if (b := r.best_of(m)) is not None] for m in metrics}
        for m, found in bests.items():
            if found and m not in modes:
                modes[m] = (found[0]["mode"], found[0]["declared"])
        summary.append({"set": list(point), "runs": [j.name for j in members], "finished": len(ok),
                        "pruned": [j.pruned for j in members if j.pruned is not None and j.code == 130],
                        "final": {m: [f[m] for f in finals if m in f] for m in metrics},
                        "best": {m: [b["value"] for b in found] for m, found in bests.items() if found},
                        "direction": {m: {"mode": found[0]["mode"], "declared": found[0]["declared"]}
                                      for m, found in bests.items() if found}})
    for row in summary:                               # metrics first seen in a later group
        for m in metrics:
            row["final"].setdefault(m, [])
    ranked = [m for m in metrics if m in modes]
    header = ["SET", "RUNS"] + [f"final {m}" for m in metrics] + \
             [f"best {m} ({mode_label(*modes[m])})" for m in ranked]
    rows = [tuple(header)]
    for row in summary:
        pruned = "".join(f" pruned@{s}" for s in row["pruned"])
        cells = [" ".join(row["set"]) or "(as written)", f"{row['finished']}/{len(row['runs'])}{pruned}"]
        cells += [_mean_std(row["final"][m]) for m in metrics]
        cells += [_mean_std(row["best"].get(m, [])) for m in ranked]
        rows.append(tuple(cells))
    notes = ["mean ± std over seeds (sample std, n-1)" if by_seed else "one run per point"]
    notes += [BY_NAME] if any(not d for _, d in modes.values()) else []
    unranked = [m for m in metrics if m not in modes]
    notes += [f"no best for {', '.join(unranked)}: neither the program nor the name says whether higher or "
              "lower is better; declare it with `checkpoint best on max|min METRIC`"] if unranked else []
    return table(rows) + "".join(f"\n({n})" for n in notes), summary
