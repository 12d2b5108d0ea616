"""One rank of the asynchronous split-roots tests (tests/shampoo/test_async_sharded.py):
joins a gloo group (torchrun's variables, tests/runtime_loop/_gloo.py), trains
:data:`SHAPES` with Shampoo on gradients every rank draws identically (as after the
all-reduce; one of them NaN in one block from step :data:`NAN_AT`, so that roots are
rejected), in each of :data:`MODES`, and saves every mode's parameters and state to
``$AROOTS_OUT/rank{r}.pt``; prints what each mode's root work computed on this rank."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from mloc.runtime.optim import shampoo
from mloc.runtime.optim.rootjobs import RootJobs
from mloc.runtime.optim.zero import Zero
from mloc.runtime.processes.ending import end_rank

SHAPES = [(13, 7), (9, 9, 2), (5,), (30, 4), (40, 8)]
KW = dict(lr=0.05, block_size=4, update_every=2, staleness=3, start_preconditioning_step=1,
          graft="adagrad", root_method="newton")
STEPS, NAN_AT, DRAIN_AT = 14, 9, 7
MODES = ("sync", "process", "thread", "zero-sync", "zero-process")


def grads(gen, params, t):
    out = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    if t >= NAN_AT:
        out[3][:4, :4] = float("nan")   # one block of (30, 4): its statistics non-finite
    return tuple(out)


def train(mode: str, params, world: int = 1, rank: int = 0):
    """``(optimizer, state)`` after :data:`STEPS` steps in ``mode`` ("sync": the roots
    computed at the refresh; "process"/"thread": ``async_roots`` on that worker; a "zero-"
    prefix: under :class:`Zero`), draining mid-refresh at step :data:`DRAIN_AT`."""
    gen = torch.Generator().manual_seed(0)
    kind = mode.removeprefix("zero-")
    RootJobs.use_process = kind != "thread"
    opt = shampoo(async_roots=kind != "sync", **KW)
    if mode.startswith("zero"):
        opt = Zero(opt, rank, world)
    opt.start()
    inner = opt.inner if isinstance(opt, Zero) else opt
    assert inner.work.jobs.ready(120) == (kind == "process")     # every job goes to the worker
    state = opt.init(params)
    with torch.no_grad():
        for t in range(1, STEPS + 1):
            state = opt.commit(grads(gen, params, t), state, params)
            if t == DRAIN_AT:
                opt.drain()
    opt.drain()
    return opt, state


def initial():
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results, saved = {}, {}
    for mode in MODES:
        params = initial()
        opt, state = train(mode, params, world, rank)
        inner = opt.inner if isinstance(opt, Zero) else opt
        process = inner.work.jobs._process
        results[mode] = {"shard": inner.work.batch.shard, "computed": inner.work.batch.computed,
                         "worker_shard": None if process is None else process.settings[2],
                         "answered": None if process is None else process.answered}
        saved[mode] = {"params": params,
                       "state": opt.gathered(state, params) if isinstance(opt, Zero) else state._asdict()}
        opt.close()
    torch.save(saved, os.path.join(os.environ["AROOTS_OUT"], f"rank{rank}.pt"))
    dist.destroy_process_group()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
