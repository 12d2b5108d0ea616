"""Benchmark: drawing a batch from a DataLoader over a TensorDataset, per example (the
loader as the user built it) against gathered (:mod:`mloc.runtime.program.gather`).

The loaders of the reweighting programs (`programs/reweighting.py`: `noisy_digits`, 5000
examples of 64 features, and `clean_digits`, 500, shuffled with a seeded generator) at
batch sizes 32, 100 and 512; one thread. For each, `--reps` passes of `--batches` draws are
timed (wall clock, `time.perf_counter`), the two ways alternating, and the medians printed
with their ratio. Before timing, the gathered batches are checked equal to the loader's,
bitwise, over two epochs.

    python3 bench/data_gather.py [--reps 7] [--batches 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from itertools import islice
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "programs")]

import reweighting  # noqa: E402

from mloc.runtime.program.gather import gathered_loader  # noqa: E402


def endless(loader):
    while True:
        yield from loader


def per_batch_ms(loader, batches: int) -> float:
    draws = endless(loader)
    start = time.perf_counter()
    for _ in islice(draws, batches):
        pass
    return (time.perf_counter() - start) / batches * 1e3


def check_equal(make) -> None:
    want = [b for _ in range(2) for b in make()]
    got = [b for _ in range(2) for b in gathered_loader(make())]
    assert len(want) == len(got) and all(
        all(torch.equal(x, y) and x.stride() == y.stride() for x, y in zip(a, b)) for a, b in zip(want, got))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="timed passes per way (median)")
    parser.add_argument("--batches", type=int, default=200, help="batches drawn per pass")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread; median of {args.reps} passes of {args.batches} batches")
    print(f"{'loader':<22}{'batch':>6}{'per example ms':>16}{'gathered ms':>13}{'ratio':>8}")
    for name in ("noisy_digits", "clean_digits"):
        for batch in (32, 100, 512):
            make = lambda: getattr(reweighting, name)(batch_size=batch)  # noqa: E731
            if len(make()) == 0:        # fewer examples than one batch, and drop_last: none to draw
                continue
            check_equal(make)
            plain, gathered = make(), gathered_loader(make())
            times = {"plain": [], "gathered": []}
            for _ in range(args.reps):
                times["plain"].append(per_batch_ms(plain, args.batches))
                times["gathered"].append(per_batch_ms(gathered, args.batches))
            p, g = statistics.median(times["plain"]), statistics.median(times["gathered"])
            print(f"{name:<22}{batch:>6}{p:>16.3f}{g:>13.3f}{g / p:>8.2f}")


if __name__ == "__main__":
    main()
