"""Shampoo's root work under data parallelism (issue 26): how many roots each rank computes
per refresh, and what a refresh costs, with N = 1, 2, … gloo processes on the CPU.

Each rank trains the same weights, one of :data:`MODELS` (``--model``: ``square``, its
weights in blocks of 32, every statistic 32 × 32 but two; ``taper``, widths 128-96-80-64-10
in blocks of 128, statistics of five sizes, where the split by cost differs from one by
count) (float32, one
intra-op thread), on gradients every rank draws identically (what the all-reduce gives),
and reports:

- ``roots/rank``: the roots this rank computes per refresh (:meth:`.RootBatch.local`,
  the chunks :func:`~mloc.runtime.optim.rootbatch.owned_chunks` gives it), of ``roots`` in
  all, and ``cost/rank``: their estimated cost in millions of ``chunk · size³``
  (:func:`~mloc.runtime.optim.rootsplit.chunk_cost`, the padding included), with the
  slowest rank's over the mean (``max/mean``, 1 when balanced) for both below the table;
- ``local``: the median wall time of this rank's share (what its background worker runs
  with ``async_roots``), ``exchange``: of the one all-gather that hands every rank the
  others' shares (:meth:`.RootBatch.exchange`), and ``refresh``: of both, the synchronous
  refresh (``--reps`` of each, the ranks aligned by a barrier before each);
- ``async``: with ``async_roots`` and ``staleness = update_every`` in a worker process, the
  training process's median step time at a refresh step (the previous refresh's job waited
  for and its shares exchanged and installed, the statistics copied out and the next job
  sent) and between refreshes.

CPU gloo on a shared machine shows the machinery, not a speed-up: with N ranks on fewer
than N free cores, ``local`` shrinks with the share only where the cores are there.

    python bench/shampoo_dp.py [--nproc 1 2] [--reps 10] [--cycles 4] [--model square|taper]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

MODELS = {"square": ([(256, 128), (128, 128), (128, 64), (64, 10)], 32),
          "taper": ([(128, 96), (96, 80), (80, 64), (64, 10)], 128)}
"""``--model``: (weight shapes, block size)."""
EVERY = 10
SHAPES, BLOCK = MODELS["square"]


def _optimizer(async_roots: bool):
    from mloc.runtime.optim import shampoo
    return shampoo(lr=0.01, block_size=BLOCK, update_every=EVERY, start_preconditioning_step=1,
                   async_roots=async_roots, staleness=EVERY if async_roots else 0)


def _params():
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _ms(times) -> float:
    return round(1e3 * statistics.median(times), 3)


def _refresh(reps: int) -> dict:
    """The synchronous refresh's two halves, timed on the statistics after EVERY steps."""
    from mloc.runtime.optim.shampoo import _orders
    params, gen = _params(), torch.Generator().manual_seed(0)
    opt = _optimizer(False)
    opt.start()
    state = opt.init(params)
    with torch.no_grad():
        for _ in range(EVERY):
            state = opt.commit(tuple(torch.randn(p.shape, generator=gen) for p in params), state, params)
    batch, ps = opt.work.batch, _orders(opt.layouts(params))
    total = sum(s.shape[0] for ss in state.stats for s in ss)
    local, exchange, mine, cost = [], [], 0, 0
    for _ in range(reps):
        dist.barrier()
        before, spent, t0 = batch.computed, batch.cost, time.perf_counter()
        done = batch.local(state.stats, ps)
        t1 = time.perf_counter()
        if batch.shard is not None:
            batch.exchange(done, ps)
        t2 = time.perf_counter()
        local.append(t1 - t0)
        exchange.append(t2 - t1)
        mine, cost = batch.computed - before, batch.cost - spent
    opt.close()
    return {"roots": total, "roots/rank": mine, "cost/rank": round(cost / 1e6, 3), "local_ms": _ms(local), "exchange_ms": _ms(exchange),
            "refresh_ms": _ms([a + b for a, b in zip(local, exchange)])}


def _async(cycles: int) -> dict:
    """Step times with asynchronous roots in the worker process, by kind of step."""
    params, gen = _params(), torch.Generator().manual_seed(0)
    opt = _optimizer(True)
    opt.start()
    assert opt.work.jobs.ready(120), "the root worker did not start"
    state = opt.init(params)
    kinds: dict[str, list] = {"refresh": [], "between": []}
    with torch.no_grad():
        for t in range(1, (cycles + 1) * EVERY + 1):
            grads = tuple(torch.randn(p.shape, generator=gen) for p in params)
            dist.barrier()
            t0 = time.perf_counter()
            state = opt.commit(grads, state, params)
            dt = time.perf_counter() - t0
            if t > EVERY:               # the first cycle warms up
                kinds["refresh" if t % EVERY == 0 else "between"].append(dt)
    process = opt.work.jobs._process
    answered = None if process is None else process.answered
    opt.close()
    return {f"async_{k}_ms": _ms(v) for k, v in kinds.items() if v} | {"async_jobs_in_worker": answered}


def rank_main(reps: int, cycles: int, model: str = "square") -> None:
    global SHAPES, BLOCK
    SHAPES, BLOCK = MODELS[model]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = {"rank": dist.get_rank(), "world": dist.get_world_size(), **_refresh(reps), **_async(cycles)}
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def launch(n: int, reps: int, cycles: int, model: str = "square") -> list[dict]:
    from mloc.runtime.processes.workers import free_port
    port, procs = free_port(), []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", str(reps), str(cycles), model],
                                      env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "a rank failed"
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--model", choices=sorted(MODELS), default="square")
    ap.add_argument("--rank-main", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        reps, cycles, model = args.rank_main
        return rank_main(int(reps), int(cycles), model)
    keys = ("roots", "roots/rank", "cost/rank", "local_ms", "exchange_ms", "refresh_ms",
            "async_refresh_ms", "async_between_ms", "async_jobs_in_worker")
    print("N  rank  " + "  ".join(keys))
    for n in args.nproc:
        ranks = launch(n, args.reps, args.cycles, args.model)
        for r in ranks:
            print(f"{n}  {r['rank']}     " + "  ".join(str(r.get(k)) for k in keys), flush=True)
        print(f"N = {n}: max/mean " + ", ".join(f"{k} {_imbalance([r[k] for r in ranks])}"
                                                for k in ("roots/rank", "cost/rank")), flush=True)


def _imbalance(values) -> float:
    """The slowest rank's share over the mean share (1: balanced)."""
    return round(max(values) / statistics.mean(values), 3)


if __name__ == "__main__":
    main()
