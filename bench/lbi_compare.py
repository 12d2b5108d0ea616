"""docs/programs.md's table for programs/lbi.mlo: learning by ignoring against fine-tuning alone.

    python3 bench/lbi_compare.py            # runs the two sweeps below (if not there), then the table
    python3 bench/lbi_compare.py --table    # the table from the sweeps' folders only
    python3 bench/lbi_compare.py --semantics  # exact against per_edge: the top hypergradient, seed 1

The sweeps (3 seeds each, one thread per run, two runs at a time):

    mloc sweep programs/lbi.mlo --seeds 1,2,3 --jobs 2 --threads 1 --compile off \\
        --set 'semantics=exact,per_edge' --set 'pretrain.loss.mu=0.01,0' --out runs/lbi/lbi
    mloc sweep programs/lbi.mlo --seeds 1,2,3 --jobs 2 --threads 1 --compile off \\
        --set 'ignore->pretrain.hypergrad=first_order' --out runs/lbi/finetune

Rows: one per sweep point (its `--set`s), from each run's ``summary.json`` (the evaluations at
the last step) and the ``summary`` record of its ``metrics.jsonl`` (training seconds, start-up
excluded). Columns: the fine-tuned model's test accuracy (mean ± sample std over seeds, and
per seed), the pre-trained model's, the mean ignoring weight on the corrupted and on the clean
source examples, and the seconds per run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = {
    "runs/lbi/lbi": ["--set", "semantics=exact,per_edge", "--set", "pretrain.loss.mu=0.01,0"],
    "runs/lbi/finetune": ["--set", "ignore->pretrain.hypergrad=first_order"],
}
COMMON = ["--seeds", "1,2,3", "--jobs", "2", "--threads", "1", "--compile", "off"]


def _seconds(run: Path) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sum(r.get("seconds", 0.0) for r in records if r.get("kind") == "summary")


def _points(sweep: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for run in sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file()):
        config = json.loads((run / "config.json").read_text())["run"]
        label = " ".join(f"--set '{s}'" for s in config["program"]["set"]) or "(as written)"
        out.setdefault(label, []).append(run)
    return out


def _stat(values: list[float], fmt: str = "{:.3f}") -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.fmean(values))} ± {fmt.format(std)}"


def row(label: str, runs: list[Path]) -> str:
    finals = []
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        if summary.get("status") != "finished":
            raise SystemExit(f"{run} did not finish ({summary.get('status')}): rerun its sweep")
        finals.append(summary["final"])
    col = {k: [f[k] for f in finals] for k in ("test_acc", "pre_acc", "w_corrupted", "w_clean")}
    seeds = ", ".join(f"{v:.3f}" for v in col["test_acc"])
    secs = [_seconds(r) for r in runs]
    return (f"| {label} | {_stat(col['test_acc'])} | {seeds} | {_stat(col['pre_acc'])} | "
            f"{_stat(col['w_corrupted'])} | {_stat(col['w_clean'])} | {_stat(secs, '{:.0f}')} |")


def table() -> str:
    lines = ["| run (`mloc sweep programs/lbi.mlo` point) | target test acc | per seed (1, 2, 3) | "
             "pre-trained test acc | mean weight, corrupted | mean weight, clean | train s per run |",
             "|---|---|---|---|---|---|---|"]
    for sweep in SWEEPS:
        for label, runs in _points(ROOT / sweep).items():
            lines.append(row(label, runs))
    return "\n".join(lines)


def semantics(steps: int = 100) -> str:
    """‖exact − per_edge‖ / ‖per_edge‖ for the top level's hypergradient (seed 1), at the
    initial state and after ``steps`` outer steps (the program as written, μ = 0.01)."""
    import torch

    import mloc
    torch.set_num_threads(1)
    program = ROOT / "programs" / "lbi.mlo"
    run, lines = mloc.load(program, seed=1), []
    for done in (0, steps):
        run.run(done - run.steps_done) if done else None
        grads = {}
        for sem in ("exact", "per_edge"):
            probe = mloc.load(program, seed=1, set=[f"semantics={sem}"])
            probe.program.load_state_dict(run.program.state_dict())
            grads[sem] = probe.hypergradients()["ignore"]["logits"]
        rel = (grads["exact"] - grads["per_edge"]).norm() / grads["per_edge"].norm()
        lines.append(f"after {run.steps_done} steps: |exact - per_edge| / |per_edge| = {rel:.2e}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["--semantics"]:
        print(semantics())
        return 0
    if argv not in ([], ["--table"]):
        print(__doc__, file=sys.stderr)
        return 2
    if not argv:
        for out, sets in SWEEPS.items():
            cmd = [sys.executable, "-m", "mloc", "sweep", "programs/lbi.mlo", *COMMON, *sets, "--out", out]
            subprocess.run(cmd, cwd=ROOT, check=True)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
