"""Peak memory (and time) of each unrolled-differentiation mode the planner can choose.

    python3 bench/plan_memory.py [--unroll 50] [--reps 3]

An HPO program (`bench/plan_memory/hpo_lib.py`): a 64-256-10 MLP trained with SGD for K
unrolled steps per hypergradient; the upper problem holds `groups` L2 strengths. For each
mode (`itd` reverse, forward, recompute) one hypergradient step is measured: peak bytes of
CPU tensor memory it allocates and holds (allocator events replayed from torch.profiler,
as in bench/hypergrad.py) and median wall time. The planner's choice for `mode = auto` is
printed beside it, with and without a memory budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hypergrad import peak_bytes  # noqa: E402

import mloc  # noqa: E402

HERE = Path(__file__).resolve().parent / "plan_memory"
PROGRAM = """program hpo_memory
import hpo_lib as lib
problem net {{
    module = lib.MLP(width=256)
    data = lib.data(seed=0)
    loss = lib.train_loss(net, decay, batch)
    optimizer = sgd(lr=0.1)
}}
problem decay {{
    module = lib.Decay(groups={groups})
    data = lib.data(seed=1)
    loss = lib.val_loss(net, batch)
    optimizer = adam(lr=0.01)
}}
decay -> net {{ hypergrad = itd(steps={k}, mode={mode}), unroll = {k} }}
train {{ steps = 10 {budget} }}
"""


def session(mode: str, k: int, groups: int, budget: str = ""):
    path = HERE / f"_bench_{mode}_{groups}.mlo"
    path.write_text(PROGRAM.format(mode=mode, k=k, groups=groups, budget=budget))
    try:
        return mloc.load(path)
    finally:
        path.unlink()


def measure(mode: str, k: int, groups: int, reps: int) -> tuple[float, float]:
    s = session(mode, k, groups)
    p = s.program
    p.draw("net")
    step = lambda: p.upper_step("decay")  # noqa: E731  draws the upper batch, hypergrad, Adam step
    step()
    peak = peak_bytes(step)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return peak / 2**20, statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unroll", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    k = args.unroll
    for groups in (2, 64):
        print(f"\n## {groups} upper parameter(s), unroll {k}\n")
        print("| mode | planner's estimate MiB | measured peak MiB | ms per hypergradient step |")
        print("|---|---|---|---|")
        for mode in ("reverse", "forward", "recompute"):
            estimate = session(mode, k, groups).plan.edges[0].memory / 2**20
            if mode == "forward" and groups > 8:
                print(f"| forward | {estimate:.2f} | (not run: {groups} JVPs per step) | |")
                continue
            peak, ms = measure(mode, k, groups, args.reps)
            print(f"| {mode} | {estimate:.2f} | {peak:.2f} | {ms:.1f} |")
        print()
        for budget in ("", "12MiB", "3MiB"):
            auto = session("auto", k, groups, f'memory_budget = "{budget}"' if budget else "").plan.edges[0]
            print(f"- budget {budget or 'none'}: planner chooses **{auto.mode}** ({auto.reason})")


if __name__ == "__main__":
    main()
