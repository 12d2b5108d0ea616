"""hpo.mlo's unrolled differentiation in each mode: time and peak memory per hypergradient step.

    python3 bench/itd_modes.py [--steps 10 100 1000] [--reps 7] [--modes reverse recompute forward]

`programs/hpo.mlo` (logistic regression on 30 features, SGD with momentum 0.9, 30 weight
decays as the upper problem) with its edge's method replaced by `itd(steps=K, mode=M)` and
`unroll = K` (`--set`, as a user would). One "hypergradient step" is the upper's step
(`Program.upper_step`: draw the upper batch, unroll K lower steps, the BR-VJP, Adam). For
each K the modes run interleaved, in a fresh random order each repetition; the table
reports each mode's median, its ratio to reverse mode's, the peak bytes of CPU tensor
memory the step allocates and holds (`PeakMemory`, storage by storage, through
bench/hypergrad.py's `peak_bytes`; parameters and data that exist before the step do not
count) and the planner's estimate of that memory and of the time (in G, one forward and
backward of the lower's loss) for the same edge.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from hypergrad import peak_bytes  # noqa: E402

import mloc  # noqa: E402

PROGRAM = ROOT / "programs" / "hpo.mlo"
MODES = ("reverse", "recompute", "forward")


def session(mode: str, k: int, dtype: str | None = None):
    return mloc.load(PROGRAM, dtype=dtype,
                     set=(f"decay->model.hypergrad=itd(steps={k}, mode={mode})", f"decay->model.unroll={k}"))


def stepper(s):
    """The upper's hypergradient step, after one untimed step (first-call costs)."""
    p = s.program
    p.draw("model")
    step = lambda: p.upper_step("decay")  # noqa: E731
    step()
    return step


def measure(k: int, modes, reps: int, dtype: str | None) -> dict:
    sessions = {m: session(m, k, dtype) for m in modes}
    steps = {m: stepper(s) for m, s in sessions.items()}
    peaks = {m: peak_bytes(step) for m, step in steps.items()}
    times: dict[str, list[float]] = {m: [] for m in modes}
    order, rng = list(modes), random.Random(k)
    for _ in range(reps):
        rng.shuffle(order)
        for m in order:
            t0 = time.perf_counter()
            steps[m]()
            times[m].append(time.perf_counter() - t0)
    return {m: (statistics.median(times[m]) * 1e3, peaks[m], sessions[m].plan.edges[0]) for m in modes}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", default=None, help="float64 to run the program in double precision")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| K | mode | ms per step | × reverse | peak MiB | planner's MiB | planner's time (G) |")
    print("|---|---|---|---|---|---|---|")
    for k in args.steps:
        rows = measure(k, args.modes, args.reps, args.dtype)
        base = rows["reverse"][0] if "reverse" in rows else None
        for mode, (ms, peak, edge) in rows.items():
            ratio = f"{ms / base:.2f}" if base else "-"
            estimate = "unknown" if edge.memory is None else f"{edge.memory / 2**20:.3f}"
            print(f"| {k} | {mode} | {ms:.1f} | {ratio} | {peak / 2**20:.3f} | {estimate} | {edge.time_g:g} |",
                  flush=True)


if __name__ == "__main__":
    main()
