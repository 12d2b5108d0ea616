"""Gradient averaging overlapped with the backward, measured with a communication delay.

Two processes (gloo on 127.0.0.1, ``--threads`` torch threads each) train
``bench/overlap.mlo`` (a 256-W-W-W-10 MLP classifier, W = ``--width``, reweighted by a
1-100-1 weight net, batch 100 per process) built with ``mloc.load`` under torchrun's
environment. Each collective of the run's :class:`~mloc.runtime.base.overlap.OverlappedSync`
is wrapped in :class:`~mloc.runtime.base.overlap.DelayedAllReduce`: it finishes no earlier
than ``D`` ms after it started or after the previous one finished (one serial link that
takes D per message); the compute goes on meanwhile. Buckets are ``--bucket-mb``, laid out
by DDP's rule (:class:`~mloc.runtime.base.overlap.Bucketer`).

Two regimes: ``--width 512 --bucket-mb 1.5`` (2.6 MB of gradient in 2 buckets, a backward of
a few ms: the delay is larger than all the compute, so at most the backward can hide it) and
``--width 2048 --bucket-mb 8`` (36 MB in 3 buckets, a backward of ~70 ms: the regime of a
large model, where the communication fits inside the backward).

Cases: ``plain``, one ``lower_step`` of the classifier; ``sama`` and ``finite_diff``, one outer
step (the classifier's step, then the weight net's hypergradient step). Each runs with
overlap on and off (``sync.overlap``, read at every call: off is the flat path) at D = 0,
5, 20 ms, the modes' steps interleaved; the time of a step is the fastest of ``--steps``
(after ``--warmup``), each started after a barrier, on rank 0. The fastest, not the median:
on the 2-core machine this was written on, shared with other jobs, a median measures the
neighbours.

**Overlap fraction.** With ``C`` the same path's step undelayed (measured interleaved with
the delayed steps, under the same load: compute and gloo's own communication, whatever of
it the path hides) and ``M = n·D`` the delay a step's ``n`` collectives add (``n`` counted at
run time), the step takes ``C + M`` when nothing overlaps and ``max(C, M)`` at best. The
fraction is ``(C + M − T(D)) / (C + M − max(C, M))``: 1 when the step takes ``max``, 0 when
it takes the sum. Only the backward can hide communication: the forward before it, and in
``sama``/``finite_diff`` whatever must wait for an averaged gradient, cannot.

**Against DistributedDataParallel.** The plain case is also written by hand with
``DistributedDataParallel(bucket_cap_mb=--bucket-mb)``, ``loss.backward()``, SGD, on the same
model, batch and loss, its buckets averaged by a comm hook on the same kind of delayed link
(:func:`_delayed_hook`), interleaved with mloc's steps at every D: DDP's own overlap
fraction beside mloc's, and at D = 0 mloc's per-step overhead under ``--nproc 2``.

With ``--per-mib`` the delay is D ms per MiB sent (a link limited by bandwidth), and ``M`` is
D times the MiB a step sends.

    python bench/overlap.py [--width 2048 --bucket-mb 8] [--per-mib]   # 1-5 min on 2 cores; --json FILE
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

    counted = {"on": 0, "off": 0, "base": 0, "base_on": 0}

    def mode(name: str, on: bool, collective):
        def run():
            sync.overlap, sync.all_reduce = on, collective
            before = sum(sync.counts.values())
            step()
            counted[name] += sum(sync.counts.values()) - before
        return run
    out = {}
    ddp = _DDPStep(args) if kind == "lower" else None
    try:
        for d in args.delays:
            links = {k: DelayedAllReduce(d / 1000, per_mib=args.per_mib) for k in ("on", "off")}
            steps = {k: mode(k, k == "on", links[k]) for k in ("on", "off")}
            if d > 0:           # C, measured beside them: each path undelayed
                steps["base"] = mode("base", False, DelayedAllReduce(0))
                steps["base_on"] = mode("base_on", True, DelayedAllReduce(0))
            if ddp is not None:     # the same plain step by hand under DDP, on its own link
                ddp_link = DelayedAllReduce(d / 1000, per_mib=args.per_mib)
                steps["ddp"] = ddp.with_link(ddp_link)
                if d > 0:
                    steps["ddp_base"] = ddp.with_link(DelayedAllReduce(0))
            counted.update(dict.fromkeys(counted, 0))
            t = _timed(steps, args.steps, args.warmup, dist.barrier)
            runs = args.steps + args.warmup
            n = {k: counted[k] / runs for k in ("on", "off")}
            mib = links["on"].sent / runs / 2**20
            out[d] = {k: v * 1000 for k, v in t.items()} | {"collectives": n, "mib": mib}
            if ddp is not None:
                out[d]["ddp_collectives"] = ddp_link.last_step
                out[d]["ddp_mib"] = ddp_link.sent / runs / 2**20
    finally:
        program.close()
    return out


class _DDPStep:
    """The plain step by hand under ``DistributedDataParallel`` (the default process group),
    its buckets averaged through a comm hook on a :class:`DelayedAllReduce` link
    (:meth:`with_link`): the same serial link, delay and bucket cap as mloc's path."""

    def __init__(self, args):
        import torch
        from torch.nn.parallel import DistributedDataParallel
        sys.path.insert(0, str(HERE))
        import overlap_lib as lib
        torch.manual_seed(0)
        self.lib, self.net, self.weights = lib, lib.MLP(width=args.width), lib.WeightNet()
        self.model = DistributedDataParallel(self.net, bucket_cap_mb=args.bucket_mb)
        self.model.register_comm_hook(self, _delayed_hook)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.loader = lib.data(seed=int(os.environ["RANK"]), batch_size=100)
        self.batches, self.link, self.world = iter(self.loader), None, int(os.environ["WORLD_SIZE"])

    def with_link(self, link):
        """The step on ``link``; ``link.last_step`` is the number of collectives its latest
        call made (DDP's first iteration buckets in its own order, then rebuilds the buckets
        in the order gradients arrived: an average over every call would mix the two)."""
        def step():
            self.link, before = link, link.calls
            self()
            link.last_step = link.calls - before
        return step

    def __call__(self) -> None:
        batch = next(self.batches, None)
        if batch is None:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        self.opt.zero_grad(set_to_none=True)
        self.lib.weighted(self.model, self.weights, batch).backward(inputs=list(self.net.parameters()))
        self.opt.step()


def _delayed_hook(step: _DDPStep, bucket):
    """DDP's default all-reduce hook (sum, then divide by the world size), its completion
    held back to the link's time: the future is set by a timer thread, so the backward goes
    on meanwhile, as with mloc's :class:`_Delayed`."""
    import threading
    import torch
    buf = bucket.buffer()
    started = step.link(buf)
    fut = torch.futures.Future()

    def done(_):
        finish = lambda: fut.set_result(buf.div_(step.world))
        left = started.done_at - time.perf_counter()
        threading.Timer(left, finish).start() if left > 0 else finish()
    started.work.get_future().then(done)
    return fut


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


def _fraction(c: float, m: float, t: float) -> float | None:
    """The share of the injected communication ``m`` hidden: ``(c + m - t) / (c + m - max(c, m))``,
    1 when the step takes ``max(c, m)``, 0 when it takes ``c + m``."""
    return (c + m - t) / (c + m - max(c, m)) if m > 0 else None


def _row(name: str, d: float, n: str, off: str, on: float, c: float, m: float) -> tuple[str, float | None]:
    frac = _fraction(c, m, on)
    return (f"{name:12} {d:>5g} {n:>7} {off:>8} {on:>8.1f} {c:>8.1f} {m:>8.1f} {c + m:>8.1f} {max(c, m):>8.1f} "
            + (f"{frac:>8.2f}" if frac is not None else f"{'-':>8}")), frac


def _report(results: dict, args) -> dict:
    per = "MiB" if args.per_mib else "collective"
    lines = [f"2 processes, gloo, {args.threads} thread(s) each, MLP width {args.width}, buckets "
             f"{args.bucket_mb:g} MiB, D per {per}, the fastest of {args.steps} interleaved steps (ms); "
             "n: collectives per step (on/off); C: the path undelayed; M: the delay its collectives add",
             f"{'case':12} {'D ms':>5} {'n':>7} {'off ms':>8} {'on ms':>8} {'C':>8} {'M':>8} {'C+M':>8} "
             f"{'max':>8} {'overlap':>8}"]
    numbers = {"width": args.width, "bucket_mb": args.bucket_mb, "per_mib": args.per_mib, "cases": []}
    for name, _, _ in CASES:
        r = results[name]
        for d in args.delays:
            x = r[d]
            n, n_off = x["collectives"]["on"], x["collectives"]["off"]
            c = x.get("base_on", x["on"])
            m = x["mib"] * d if args.per_mib else n * d
            line, frac = _row(name, d, f"{n:g}/{n_off:g}", f"{x['off']:.1f}", x["on"], c, m)
            lines.append(line)
            numbers["cases"].append({"case": name, "delay_ms": d, "collectives_on": n, "collectives_off": n_off,
                                     "off_ms": x["off"], "c_ms": c, "m_ms": m, "on_ms": x["on"],
                                     "overlap_fraction": frac})
            if "ddp" in x:
                nd = x["ddp_collectives"]
                md = x["ddp_mib"] * d if args.per_mib else nd * d
                cd = x.get("ddp_base", x["ddp"])
                line, frac = _row("  DDP", d, f"{nd:g}", "", x["ddp"], cd, md)
                lines.append(line)
                numbers["cases"].append({"case": "plain DDP", "delay_ms": d, "collectives_on": nd,
                                         "c_ms": cd, "m_ms": md, "on_ms": x["ddp"], "overlap_fraction": frac})
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
