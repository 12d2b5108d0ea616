"""Long-tailed digits: Meta-Weight-Net against plain and class-balanced cross-entropy.

    python3 bench/longtail_compare.py [--out DIR] [--seeds 0,1,2] [--jobs 2] [--report-only] [--weights]

Two ``mloc sweep``s (the commands are printed; a rerun of this script continues them, and
finished runs are skipped), eager steps pinned (``--compile off``) so that all runs are the
same computation, one thread per run:

1. programs/longtail_baseline.mlo: imbalance factor 10 and 100 × β = 0 (plain
   cross-entropy) and 0.999 (class-balanced, Cui et al. 2019) × training on the long-tailed
   set alone or with the meta set's 100 balanced images added (``with_meta``: the images
   Meta-Weight-Net's upper problem sees, given to the baseline as training data).
2. programs/longtail.mlo (Meta-Weight-Net): imbalance factor 10 and 100 × the hypergradient
   ``sama``, ``finite_diff``, ``neumann``.

Prints one markdown row per (imbalance, method): the final balanced test accuracy as mean ±
sample std over the seeds, each seed's, the accuracy on the three rarest classes (7, 8, 9),
for Meta-Weight-Net whether its mean beats plain cross-entropy and class-balanced weights
on the same training images and the better of the two baselines trained on the meta images
too, and the time per run: the run's own training seconds (its ``summary``
record) and its wall time as ``mloc sweep`` reported it (process start to end, imports
and compilation included). ``--report-only`` tabulates finished sweeps; ``--weights`` also
prints each Meta-Weight-Net run's learned weight function w(ℓ) at a few losses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "programs"
IMBALANCE = "classifier.data.imbalance=10,100"
BASELINE_AXES = [IMBALANCE, "classifier.loss.beta=0,0.999", "classifier.data.with_meta=false,true"]
METHODS = "sama(eps=0.01),finite_diff(eps=0.01),neumann(iters=5, alpha=0.1)"
MWN_AXES = [IMBALANCE, f"weight_net->classifier.hypergrad={METHODS}"]
DONE = re.compile(r"^\[\d+/\d+\] (\S+): done in ([0-9.]+) s$")


def sweep_command(program: str, axes: list[str], seeds: str, jobs: int, out: Path) -> list[str]:
    sets = [arg for axis in axes for arg in ("--set", axis)]
    return [sys.executable, "-m", "mloc", "sweep", str(PROGRAMS / program), "--seeds", seeds, *sets,
            "--jobs", str(jobs), "--threads", "1", "--compile", "off", "--out", str(out)]


def run_sweep(cmd: list[str], out: Path) -> None:
    """Run (or continue) one sweep; its stderr also goes to ``out``.err (beside the sweep's
    folder, which the sweep wants fresh), where the per-run wall times are read from."""
    print("$ " + " ".join(["mloc", *cmd[3:]]), file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(_err(out), "a") as log:
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for line in proc.stderr:
            sys.stderr.write(line)
            log.write(line)
        if proc.wait() != 0:
            raise SystemExit(f"the sweep failed (exit {proc.returncode}): see {out}/logs")


def _err(sweep: Path) -> Path:
    return sweep.parent / f"{sweep.name}.err"


def walls(sweep: Path) -> dict[str, float]:
    """Each run's wall seconds, from the sweep's stderr (the last report of each run)."""
    err = _err(sweep)
    found = {}
    for line in err.read_text().splitlines() if err.exists() else []:
        m = DONE.match(line.strip())
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def train_seconds(run: Path) -> float:
    for line in reversed((run / "metrics.jsonl").read_text().splitlines()):
        record = json.loads(line)
        if record.get("kind") == "summary":
            return float(record["seconds"])
    raise ValueError(f"{run}: no summary record in metrics.jsonl (did the run finish?)")


def points(sweep: Path) -> list[dict]:
    """One dict per sweep point: its settings (key -> value), final acc and tail_acc per seed,
    training and wall seconds per run."""
    record = json.loads((sweep / "sweep.json").read_text())
    wall = walls(sweep)
    rows = []
    for point in record["points"]:
        settings = dict(s.split("=", 1) for s in point["set"])
        rows.append(dict(settings=settings, acc=point["final"]["acc"], tail=point["final"]["tail_acc"],
                         train_s=[train_seconds(sweep / r) for r in point["runs"]],
                         wall_s=[wall[r] for r in point["runs"] if r in wall]))
    return rows


def label(settings: dict) -> str:
    if "weight_net->classifier.hypergrad" in settings:
        return f"MWN, `{settings['weight_net->classifier.hypergrad']}`"
    name = "plain CE (β = 0)" if float(settings["classifier.loss.beta"]) == 0 else \
        f"class-balanced, β = {settings['classifier.loss.beta']}"
    return name + (", train + meta" if settings["classifier.data.with_meta"] == "true" else "")


def pct(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.2f} ± {100 * std:.2f}"


def verdict(mean: float, base: float | None) -> str:
    if base is None:
        return "–"
    gap = 100 * (mean - base)
    return f"{'yes' if gap > 0 else '**no**'} ({gap:+.2f})"


PLAIN, BALANCED = "plain CE (β = 0)", "class-balanced, β = 0.999"
WITH_META = (PLAIN + ", train + meta", BALANCED + ", train + meta")


def report(rows: list[dict]) -> None:
    """Per imbalance factor: the four baselines, then the Meta-Weight-Net rows, each of those
    against plain CE and class-balanced weights on the same images and against the better of
    the two baselines that also train on the meta set's images."""
    print("| IF | method | test acc % | per seed | tail acc % (7, 8, 9) | beats plain CE? | "
          "beats class-balanced? | beats the better train + meta baseline? | train s / run | wall s / run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for imbalance in sorted({r["settings"]["classifier.data.imbalance"] for r in rows}, key=float):
        group = {label(r["settings"]): r for r in rows if r["settings"]["classifier.data.imbalance"] == imbalance}
        mean = {name: statistics.fmean(r["acc"]) for name, r in group.items()}
        meta = max((mean[n] for n in WITH_META if n in mean), default=None)
        order = [n for n in (PLAIN, BALANCED, *WITH_META) if n in group] + \
                [n for n in group if n.startswith("MWN")]
        for name in order:
            r, mwn = group[name], name.startswith("MWN")
            verdicts = [verdict(mean[name], mean.get(PLAIN)), verdict(mean[name], mean.get(BALANCED)),
                        verdict(mean[name], meta)] if mwn else ["–"] * 3
            wall = f"{statistics.fmean(r['wall_s']):.0f}" if r["wall_s"] else "–"
            print(f"| {imbalance} | {name} | {pct(r['acc'])} | {', '.join(f'{100 * a:.1f}' for a in r['acc'])} | "
                  f"{pct(r['tail'])} | {' | '.join(verdicts)} | {statistics.fmean(r['train_s']):.0f} | {wall} |")


def weight_functions(sweep: Path, losses=(0.01, 0.1, 0.5, 1.0, 2.0)) -> None:
    """Each Meta-Weight-Net run's learned w(ℓ) at a few losses: the run's program rebuilt
    with ``mloc.load`` (its ``--set``s and seed, from ``config.json``), its last checkpoint
    restored."""
    import torch

    import mloc

    torch.set_num_threads(1)
    print(f"\nw(loss) at loss = {', '.join(map(str, losses))}, each Meta-Weight-Net run's checkpoint.pt:")
    for name in json.loads((sweep / "sweep.json").read_text())["runs"]:
        config = json.loads((sweep / name / "config.json").read_text())["run"]
        session = mloc.load(config["program"]["file"], set=config["program"]["set"], seed=config["seed"])
        session.restore(sweep / name / "checkpoint.pt")
        with torch.no_grad():
            w = session.module("weight_net")(torch.tensor(losses))
        print(f"  {name}: {' '.join(f'{v:.3f}' for v in w.tolist())}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "longtail_compare")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--report-only", action="store_true", help="tabulate the sweeps in --out, run nothing")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--weights", action="store_true", help="also print each MWN run's learned weight function")
    args = p.parse_args(argv)
    sweeps = {"baseline": ("longtail_baseline.mlo", BASELINE_AXES), "mwn": ("longtail.mlo", MWN_AXES)}
    if not args.report_only:
        for name, (program, axes) in sweeps.items():
            run_sweep(sweep_command(program, axes, args.seeds, args.jobs, args.out / name), args.out / name)
    rows = [row for name in sweeps for row in points(args.out / name)]
    report(rows)
    if args.weights:
        weight_functions(args.out / "mwn")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
