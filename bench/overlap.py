"""Gradient averaging overlapped with the backward, measured with a communication delay.

Two processes (gloo on 127.0.0.1, ``--threads`` torch threads each) train
``bench/overlap.mlo`` (a 256-W-W-W-10 MLP classifier, W = ``--width`` = 512, reweighted by a
1-100-1 weight net, batch 100 per process) built with ``mloc.load`` under torchrun's
environment. Each collective of the run's :class:`~mloc.runtime.base.overlap.OverlappedSync`
is wrapped in :class:`~mloc.runtime.base.overlap.DelayedAllReduce`: it finishes no earlier
than ``D`` ms after it started or after the previous one finished (one serial link that
takes D per message); the compute goes on meanwhile. Buckets are ``--bucket-mb`` (1.5 MiB:
3 buckets of the classifier's 2.6 MB of gradient, so that this small model has several, as
a model of hundreds of MB has with DDP's 25 MiB).

Cases: ``plain``, one ``lower_step`` of the classifier; ``sama`` and ``finite_diff``, one outer
step (the classifier's step, then the weight net's hypergradient step). Each runs with
overlap on and off (``sync.overlap``, read at every call: off is the flat path) at D = 0,
5, 20 ms, the two modes' steps interleaved; the time of a step is the fastest of
``--steps`` (after ``--warmup``), each started after a barrier, on rank 0. The fastest, not
the median: on the 2-core machine this was written on, shared with other jobs (load
average 5-8), a median measures the neighbours.

**Overlap fraction.** With ``C`` the step's time without delay and without overlap
(off and undelayed, interleaved with the delayed steps: compute and undelayed
communication, measured under the same load), ``M = n·D`` the delay a step's
``n`` collectives add (``n`` counted at run time), the step takes ``C + M`` when nothing
overlaps and ``max(C, M)`` at best. The fraction is ``(C + M − T_on(D)) / (C + M − max(C, M))``:
1 when the overlapped step takes ``max``, 0 when it takes the sum (``M`` is the overlapped
path's: one delay per bucket; the flat path pays one per backward, ``T_off(D)``). Only the
backward can hide communication: the forward before it and the optimizer after the last
bucket cannot, so 1 is out of reach when ``M`` exceeds the backward alone.

With ``--per-mib`` the delay is D ms per MiB sent (a link limited by bandwidth, where
splitting a gradient into buckets costs nothing more), and ``M`` is D times the MiB a step
sends: the flat and the overlapped path then pay the same communication.

**Against DistributedDataParallel.** The plain case is also written by hand with
``DistributedDataParallel(bucket_cap_mb=--bucket-mb)``, ``loss.backward()``, SGD, on the same
model, batch and loss, in the same run, at D = 0: the difference is mloc's per-step
overhead under ``--nproc 2``.

    python bench/overlap.py [--per-mib]        # ~1 min on 2 cores; --json FILE writes the numbers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "overlap.mlo"
CASES = (("plain", "sama(eps=0.01)", "lower"), ("sama", "sama(eps=0.01)", "outer"),
         ("finite_diff", "finite_diff(eps=0.01)", "outer"))


def _timed(steps: dict, n: int, warmup: int, barrier) -> dict[str, float]:
    """Seconds per step of each of ``steps`` (name -> callable), interleaved step by step so
    that a change of the machine's load falls on all alike: the fastest of ``n`` (on a
    machine shared with other jobs the fastest is the step's own cost; a median there
    measures the neighbours: see the module docstring)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(n):
        for name, step in steps.items():
            barrier()
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    return {k: min(v) for k, v in times.items()}


def _mloc_case(args, method: str, kind: str, port: int) -> dict:
    """One program, its steps with overlap on and off interleaved (``sync.overlap`` is read
    at every call: off is the flat path), at each delay; the plain case also times the
    hand-written DDP step (:func:`_ddp_step`) on the same process group, undelayed."""
    import torch.distributed as dist
    import mloc
    from mloc.runtime.base.overlap import DelayedAllReduce
    os.environ["MASTER_PORT"] = str(port)
    program = mloc.load(PROGRAM, set=[f"weights->classifier.hypergrad={method}", *args.set]).program
    sync = program.sync
    sync.cap_bytes = int(args.bucket_mb * 2**20)
    step = (lambda: program.lower_step("classifier")) if kind == "lower" else program.outer_step

    counted = {"on": 0, "off": 0, "base": 0}

    def mode(name: str, on: bool, collective):
        def run():
            sync.overlap, sync.all_reduce = on, collective
            before = sum(sync.counts.values())
            step()
            counted[name] += sum(sync.counts.values()) - before
        return run
    out = {}
    try:
        for d in args.delays:
            links = {k: DelayedAllReduce(d / 1000, per_mib=args.per_mib) for k in ("on", "off")}
            steps = {k: mode(k, k == "on", links[k]) for k in ("on", "off")}
            if d > 0:           # C, measured beside them: off, undelayed
                steps["base"] = mode("base", False, DelayedAllReduce(0))
            if kind == "lower" and d == 0:
                steps["ddp"] = _ddp_step(args)
            counted.update(dict.fromkeys(counted, 0))
            t = _timed(steps, args.steps, args.warmup, dist.barrier)
            n = {k: counted[k] / (args.steps + args.warmup) for k in ("on", "off")}
            mib = links["on"].sent / (args.steps + args.warmup) / 2**20
            out[d] = {k: v * 1000 for k, v in t.items()} | {"collectives": n, "mib": mib}
    finally:
        program.close()
    return out


def _ddp_step(args):
    """The plain step by hand under DistributedDataParallel (the default process group)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    sys.path.insert(0, str(HERE))
    import overlap_lib as lib
    torch.manual_seed(0)
    net, weights = lib.MLP(width=args.width), lib.WeightNet()
    model = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rank = int(os.environ["RANK"])
    loader = lib.data(seed=rank, batch_size=100)
    batches = iter(loader)

    def step():
        nonlocal batches
        batch = next(batches, None)
        if batch is None:
            batches = iter(loader)
            batch = next(batches)
        opt.zero_grad(set_to_none=True)
        lib.weighted(model, weights, batch).backward(inputs=list(net.parameters()))
        opt.step()
    return step


def worker(rank: int, args, port: int) -> None:
    import torch
    torch.set_num_threads(args.threads)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    results = {name: _mloc_case(args, method, kind, port + k) for k, (name, method, kind) in enumerate(CASES)}
    if rank == 0:
        report = _report(results, args)
        print(report["text"])
        if args.json:
            Path(args.json).write_text(json.dumps(report["numbers"], indent=1))


def _report(results: dict, args) -> dict:
    lines = [f"2 processes, gloo, {args.threads} thread(s) each, MLP width {args.width}, buckets "
             f"{args.bucket_mb:g} MiB, D per {'MiB' if args.per_mib else 'collective'}, the fastest of {args.steps} "
             "interleaved steps (ms); on/off: collectives per step",
             f"{'case':12} {'D ms':>5} {'on/off':>7} {'off ms':>8} {'on ms':>8} {'C':>8} {'C+M':>8} {'max':>8} {'overlap':>8}"]
    numbers = {"cases": []}
    for name, _, _ in CASES:
        r = results[name]
        for d in args.delays:
            c = r[d].get("base", r[d]["off"])
            n, n_off = r[d]["collectives"]["on"], r[d]["collectives"]["off"]
            m = r[d]["mib"] * d if args.per_mib else n * d
            frac = (c + m - r[d]["on"]) / (c + m - max(c, m)) if m > 0 else None
            lines.append(f"{name:12} {d:>5g} {n:>3g}/{n_off:<3g} {r[d]['off']:>8.1f} {r[d]['on']:>8.1f} "
                         + f"{c:>8.1f} {c + m:>8.1f} {max(c, m):>8.1f} "
                         + (f"{frac:>8.2f}" if frac is not None else f"{'-':>8}"))
            numbers["cases"].append({"case": name, "delay_ms": d, "collectives_on": n, "collectives_off": n_off,
                                     "off_ms": r[d]["off"], "c_ms": c,
                                     "on_ms": r[d]["on"], "overlap_fraction": frac})
    plain = results["plain"].get(0)
    if plain:
        numbers["ddp_plain_ms"] = plain["ddp"]
        lines.append(f"plain step at D = 0: mloc --nproc 2 {plain['on']:.1f} ms (overlap on), "
                     f"{plain['off']:.1f} ms (off); hand-written DDP {plain['ddp']:.1f} ms; "
                     f"overhead {plain['on'] - plain['ddp']:+.1f} ms ({plain['on'] / plain['ddp'] - 1:+.0%})")
    return {"text": "\n".join(lines), "numbers": numbers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=1.5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--delays", type=float, nargs="+", default=[0, 5, 20])
    p.add_argument("--per-mib", action="store_true",
                   help="D ms per MiB sent (a link limited by bandwidth) rather than per collective")
    p.add_argument("--port", type=int, default=29731)
    p.add_argument("--json")
    args = p.parse_args()
    args.set = [f"classifier.module=lib.MLP(width={args.width}, depth=3)"]
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args, args.port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
