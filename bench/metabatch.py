"""Benchmark: a meta-batch of k tasks solved one after another against vectorized (`vmap = true`).

`programs/imaml.mlo` (sinusoid regression, a 1-40-40-1 ReLU net, 10 shots, 5 inner SGD
steps per task, iMAML's proximal term) with `accumulate = k` for k ∈ {4, 16, 64} and the
methods `cg(iters=10)` (iMAML) and `first_order` (FO-iMAML), fp32, CPU, one thread
(`--threads`). One meta step (`Session.step()`) of each form is timed in turn, in a fresh
random order each repetition, after two warm-up steps; the table reports medians and the
ratio vmap / sequential (below 1: vmap is faster).

    python3 bench/metabatch.py [--reps 7] [--threads 1]
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

import mloc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", default="4,16,64")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.reps} meta steps")
    print(f"{'method':<12} {'tasks':>5} {'sequential ms':>14} {'vmap ms':>9} {'vmap/seq':>9}")
    for method in ("cg(iters=10)", "first_order"):
        for k in (int(t) for t in args.tasks.split(",")):
            sessions = {v: mloc.load(ROOT / "programs" / "imaml.mlo",
                                     set=[f"meta.accumulate={k}", f"meta.vmap={v}",
                                          f"meta->adapt.hypergrad={method}"])
                        for v in ("false", "true")}
            for s in sessions.values():
                s.step()
                s.step()
            times = {v: [] for v in sessions}
            for _ in range(args.reps):
                order = list(sessions)
                random.shuffle(order)
                for v in order:
                    t = time.perf_counter()
                    sessions[v].step()
                    times[v].append(time.perf_counter() - t)
            seq, vec = (statistics.median(times[v]) for v in ("false", "true"))
            print(f"{method:<12} {k:>5} {seq * 1e3:>14.1f} {vec * 1e3:>9.1f} {vec / seq:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
