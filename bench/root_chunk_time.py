"""The cost model of the split of Shampoo's roots across ranks
(:func:`mloc.runtime.optim.rootsplit.chunk_cost`, ``chunk · size³``) against the measured
time of one chunk's roots (:meth:`.RootBatch._root`, one intra-op thread, float32 random
SPD statistics, the median of ``--reps``), for the chunks of ``bench/shampoo_dp.py``'s
models, by root method: ``ns/unit`` (time over estimated cost) is constant where the model
holds.

    python bench/root_chunk_time.py [--method newton eigh] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mloc.runtime.optim.rootbatch import RootBatch
from mloc.runtime.optim.rootsplit import chunk_cost

CHUNKS = [(1, 128), (2, 96), (2, 80), (2, 64), (1, 10), (16, 32), (2, 10)]
"""``(matrices, size)``: the taper model's chunks, then the square model's."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", nargs="+", default=["newton", "eigh"])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("method  chunk  size  cost  ms  ns/unit")
    for method in args.method:
        batch, gen = RootBatch(1e-6, method), torch.Generator().manual_seed(0)
        for c, d in CHUNKS:
            x = torch.randn(c, d, 2 * d, generator=gen)
            stats = x @ x.transpose(-2, -1)
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                batch._root(stats, 4)
                times.append(time.perf_counter() - t0)
            ms = 1e3 * statistics.median(times)
            print(f"{method}  {c}  {d}  {chunk_cost(c, d)}  {ms:.3f}  {1e6 * ms / chunk_cost(c, d):.2f}", flush=True)


if __name__ == "__main__":
    main()
