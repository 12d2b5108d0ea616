"""DARTS on digits (programs/darts.mlo): searched architectures, retrained, against random ones.

    python3 bench/darts_compare.py [--sweep DIR] [--seeds 1,2,3] [--methods M;M] [--compile off] [--retrain-steps 400] [--json FILE]

1. The search: one ``mloc sweep`` of the program, ``finite_diff`` (DARTS' second-order
   approximation with ξ = 1), ``finite_diff(xi=0.05)`` (the program as written) and ``sama``
   (the same with ξ = the weights' learning rate, as in the paper: with SGD below, SAMA's
   diagonal is the rate)
   and ``first_order`` (its first-order variant) × the seeds (``--methods``: a subset,
   given as the keys of ``METHODS`` separated by ``;``), two runs at a time on one thread each (the command is printed; ``--sweep DIR`` reuses a finished sweep
   folder instead of running one: a rerun of the same command also continues it).
2. For each search run, :func:`darts.derive` (``mloc.load`` + the run's ``best.pt``) gives its
   architecture, and :func:`darts.retrain` trains it from scratch with the run's seed.
3. The baseline: for each seed, :func:`darts.random_arch` (uniform over the same space,
   without ``zero``), retrained the same way with that seed.

Prints one markdown row per method: the test accuracy of the retrained networks as mean ±
sample std over the seeds, each seed's architecture, and the wall time (the search runs'
own seconds, as ``metrics.jsonl`` records them, and the retraining).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "programs"))

import darts  # noqa: E402

PROGRAM = ROOT / "programs" / "darts.mlo"
EDGE = "arch->net.hypergrad"
METHODS = {"finite_diff(eps=0.01)": "searched, finite_diff (DARTS 2nd order, ξ = 1)",
           "finite_diff(eps=0.01, xi=0.05)": "searched, finite_diff(xi=0.05) (DARTS 2nd order, ξ = lr)",
           "sama(eps=0.01)": "searched, sama (DARTS 2nd order, ξ = lr)",
           "first_order": "searched, first_order (DARTS 1st order)"}
SHORT = {"skip": "s", "conv3x3": "c3", "conv1x1": "c1", "avgpool": "a", "maxpool": "m"}


def sweep_command(seeds: str, out: Path, methods: list[str] = list(METHODS), compile: str = "auto") -> list[str]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"darts_compare: unknown method {unknown[0]!r}; the methods are {'; '.join(METHODS)}")
    return [sys.executable, "-m", "mloc", "sweep", str(PROGRAM), "--seeds", seeds,
            "--set", f"{EDGE}={','.join(methods)}", "--jobs", "2", "--threads", "1",
            "--compile", compile, "--out", str(out)]


def run_seconds(run: Path) -> float:
    """The run's own training seconds (its closing ``summary`` record)."""
    for line in reversed((run / "metrics.jsonl").read_text().splitlines()):
        record = json.loads(line)
        if record.get("kind") == "summary":
            return float(record["seconds"])
    raise ValueError(f"{run}: no summary record in metrics.jsonl (did the run finish?)")


def timed_retrain(arch, seed: int, steps: int) -> tuple[float, float]:
    start = time.perf_counter()
    acc = darts.retrain(arch, seed=seed, steps=steps)
    return acc, time.perf_counter() - start


def searched_rows(sweep: Path, steps: int) -> list[dict]:
    record = json.loads((sweep / "sweep.json").read_text())
    rows = []
    for point in record["points"]:
        (setting,) = point["set"]
        method = setting.split("=", 1)[1]
        row = dict(method=METHODS.get(method, method), set=setting, seeds=[], archs=[], accs=[],
                   search_s=0.0, retrain_s=0.0)
        for name in point["runs"]:
            run = sweep / name
            seed = json.loads((run / "config.json").read_text())["run"]["seed"]
            arch = darts.derive(run, quiet=True)
            acc, seconds = timed_retrain(arch, seed, steps)
            row["seeds"].append(seed)
            row["archs"].append(arch)
            row["accs"].append(acc)
            row["search_s"] += run_seconds(run)
            row["retrain_s"] += seconds
            print(f"  {method} seed {seed}: {' '.join(arch)} -> test acc {acc:.4f}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def random_row(seeds: list[int], steps: int) -> dict:
    row = dict(method="random (same space)", set="darts.random_arch(seed)", seeds=seeds, archs=[], accs=[],
               search_s=0.0, retrain_s=0.0)
    for seed in seeds:
        arch = darts.random_arch(seed)
        acc, seconds = timed_retrain(arch, seed, steps)
        row["archs"].append(arch)
        row["accs"].append(acc)
        row["retrain_s"] += seconds
        print(f"  random seed {seed}: {' '.join(arch)} -> test acc {acc:.4f}", file=sys.stderr, flush=True)
    return row


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.2f} ± {100 * std:.2f}"


def report(rows: list[dict], steps: int) -> None:
    print(f"torch {torch.__version__}, 1 thread per process; retraining: {steps} SGD steps on 1397 images, "
          "test on 400; architectures edge by edge (0->1, 0->2, 1->2, 0->3, 1->3, 2->3; "
          "s skip, c3/c1 3x3/1x1 conv, a avg pool, m max pool)")
    print()
    print("| architectures | test accuracy % (mean ± std, 3 seeds) | per seed | architecture per seed | "
          "search s (sum of runs) | retrain s (sum) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        per_seed = ", ".join(f"{100 * a:.2f}" for a in r["accs"])
        archs = "; ".join(" ".join(SHORT[o] for o in arch) for arch in r["archs"])
        search = f"{r['search_s']:.0f}" if r["search_s"] else "-"
        print(f"| {r['method']} | {mean_std(r['accs'])} | {per_seed} | {archs} | {search} | {r['retrain_s']:.0f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", type=Path, help="a finished sweep folder of programs/darts.mlo (default: run one)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--methods", default=";".join(METHODS), help="the searches to run, separated by ';' (default: all)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="passed to the sweep's runs (auto compiles a run whose eager steps look slow: "
                        "on a busy machine, off keeps the searches eager and comparable)")
    p.add_argument("--retrain-steps", type=int, default=400)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sweep = args.sweep
    if sweep is None:
        sweep = ROOT / "runs" / "darts_compare"
        cmd = sweep_command(args.seeds, sweep, [m.strip() for m in args.methods.split(";") if m.strip()],
                            args.compile)
        print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run(cmd, check=True, env=env)
    rows = searched_rows(sweep, args.retrain_steps)
    rows.append(random_row([int(s) for s in args.seeds.split(",")], args.retrain_steps))
    report(rows, args.retrain_steps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
