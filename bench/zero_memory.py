"""Per-rank optimizer-state bytes under `--strategy zero` against `ddp`, N = 1, 2, 4 processes.

N gloo processes on 127.0.0.1 (one thread each) build ``bench/overlap.mlo`` with ``mloc.load``
under torchrun's environment, its classifier a 256-W-...-W-10 MLP (``--width`` W = 512,
``--depth`` hidden layers = 8) trained by ``--optimizer`` (default Adam: two floats of state
per parameter) and the weight net by Adam; each takes ``--steps`` outer steps (so that every
state exists), then reports the bytes of every tensor in its problems' optimizer states
(``mloc.runtime.base.tree.tensors``: Shampoo's statistics, roots and pending slots
included; a step count is a Python int, no bytes). Rank 0 prints, per N and strategy, the
largest and smallest rank's bytes and the largest over the whole (ddp's at N = 1): ZeRO's
whole-tensor partition reaches 1/N when the tensors can be split evenly by bytes, and
the largest tensor's share is its floor.

    python bench/zero_memory.py                           # ~1 min on 2 cores
    python bench/zero_memory.py --optimizer "shampoo(lr=0.01, block_size=128)"
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "overlap.mlo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, args, queue) -> None:
    import torch
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import mloc
    from mloc.runtime.base import tree
    sets = [f"classifier.module=lib.MLP(width={args.width}, depth={args.depth})",
            f"classifier.optimizer={args.optimizer}"]
    session = mloc.load(PROGRAM, set=sets, strategy=args.strategy)
    program = session.program
    try:
        for _ in range(args.steps):
            program.outer_step()
        state = sum(t.numel() * t.element_size() for lv in program.live.values()
                    for t in tree.tensors(lv.problem.state))
        queue.put((rank, state, program.strategy[0]))
    finally:
        program.close()


def measure(world: int, args) -> tuple[list[int], str]:
    """Each rank's optimizer-state bytes, in rank order, and the strategy the run used."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a worker failed (exit {p.exitcode})")
    got = sorted(queue.get() for _ in range(world))
    return [b for _, b, _ in got], got[0][2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--optimizer", default="adam(lr=1e-3)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    rows, whole = [], None
    for world in args.worlds:
        for strategy in ("ddp", "zero"):
            args.strategy = strategy
            per_rank, used = measure(world, args)
            whole = whole or max(per_rank)
            rows.append((world, strategy, used, max(per_rank), min(per_rank)))
    print(f"classifier MLP 256-{args.width}x{args.depth}-10 under {args.optimizer}, weight net under adam; "
          f"optimizer-state bytes per rank after {args.steps} steps")
    print(f"{'N':>2} {'asked':>5} {'ran':>5} {'largest rank':>14} {'smallest rank':>14} {'largest/whole':>14} {'1/N':>6}")
    for world, strategy, used, hi, lo in rows:
        print(f"{world:>2} {strategy:>5} {used:>5} {hi:>14,} {lo:>14,} {hi / whole:>14.3f} {1 / world:>6.3f}")


if __name__ == "__main__":
    main()
