"""Interlocking backpropagation as a real pipeline: one process per stage.

``mloc run --pipeline`` (or ``python train.py --pipeline``) starts K workers for a program
that is one interlocking chain of K stages; worker j owns stage j (its module, its head,
its optimizer and commit pipeline) and talks to its neighbours over ``torch.distributed``
(gloo on 127.0.0.1), one thread each. Per step, worker j:

1. receives stage j-1's features (j > 0), runs its stage (F) and sends its output on;
2. evaluates its head where the chain needs it (A), giving the signal of its own loss;
3. for every head t whose gradient signal passes through it (``Interlock.signals(j)``,
   its own first, then in depth order) receives the signal ``dl_t/d out_j`` from worker
   j+1, computes its parameters' gradient when l_t trains it (B) and the signal at its
   input when l_t reaches further down (B_in), which it sends to worker j-1 at once;
4. commits its gradients through its own pipeline, then starts the next step.

Each signal is its own message, so worker j waits only for the n-1 workers below its
target head, never for the whole backward pass: the steady period is about
``P(n) = nF + (n-1)B_in + B + A + 2(n-1)c`` (c: one hop), against ``(2K+1)F`` for
end-to-end backpropagation. Every gradient is taken at the parameters of the step before
(a worker's next forward follows its commit), with the same primitives and in the same
order as the one-process simulation (:class:`mloc.runtime.interlock.ChainStep`), so both
give the same parameters.

Every worker builds the whole program (same seed: the same initial parameters) and draws
the chain's batches from its first stage's stream itself (the same deterministic
sequence; the labels are needed by every head). ``delay`` emulates a slower device per
stage on a small machine: a sleep of ``delay`` after each forward and B_in, and ``2 delay``
after each B (B ~ 2F). Busy time (computing, sleeps included) and idle time (waiting for
a message) are recorded per worker; `pipeline.json` in the run folder has them, with each
step's wall time, and ``stage<j>.pt`` each stage's final parameters. Not supported in this
mode: checkpoints and resuming, evaluations during training, data parallelism.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from mloc.runtime.interlock import (ChainContractError, add_into, forward_stage, head_backward, input_backward,
                                    param_backward, stages_of)
from mloc.runtime import tree


class PipelineError(Exception):
    """A program the pipeline cannot run (not one chain), or a worker that failed."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


def chain_of(ns: dict):
    """The one chain of a generated program that is nothing but that chain."""
    chains = ns.get("CHAINS", ())
    names = {s.name for s in ns["PROBLEMS"]}
    if len(chains) != 1 or set(chains[0].stages) != names:
        raise PipelineError("--pipeline runs a program that is one interlocking chain, and nothing else",
                            "train this program without --pipeline")
    return chains[0]


# --- the messages ------------------------------------------------------------------------------

class Wire:
    """Blocking receives from and sends to the neighbours, timed: ``idle`` accumulates
    the seconds spent waiting. A tensor goes as a header (its shape) then its data."""

    def __init__(self, dtype: torch.dtype):
        self.dtype, self.idle, self.pending = dtype, 0.0, []

    def send(self, t: torch.Tensor, to: int) -> None:
        t = t.detach().contiguous()
        shape = torch.tensor([t.dim(), *t.shape] + [0] * (7 - t.dim()), dtype=torch.int64)
        self.pending += [dist.isend(shape, to), dist.isend(t, to)]
        self._keep = getattr(self, "_keep", []) + [shape, t]

    def recv(self, frm: int) -> torch.Tensor:
        start = time.perf_counter()
        shape = torch.empty(8, dtype=torch.int64)
        dist.recv(shape, frm)
        out = torch.empty(tuple(shape[1:1 + int(shape[0])].tolist()), dtype=self.dtype)
        dist.recv(out, frm)
        self.idle += time.perf_counter() - start
        return out

    def flush(self) -> None:
        start = time.perf_counter()
        for w in self.pending:
            w.wait()
        self.pending, self._keep = [], []
        self.idle += time.perf_counter() - start


def _hop_latency(rank: int, world: int, rounds: int = 20) -> float | None:
    """Half the round trip of a small message between workers 0 and 1 (c in P(n))."""
    if world < 2 or rank > 1:
        return None
    x = torch.zeros(8)
    start = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    return (time.perf_counter() - start) / (2 * rounds)


# --- one worker ------------------------------------------------------------------------------

def worker(train_py: Path, rank: int, world: int, port: int, steps: int, seed: int | None,
           dtype: str | None, delay: float, out: Path) -> None:
    """Stage ``rank``'s process (see the module docstring)."""
    torch.set_num_threads(1)
    from mloc.runtime.launch import build
    ns = runpy.run_path(str(train_py), run_name="mloc_pipeline_worker")
    chain = chain_of(ns)
    config = ns["DEFAULTS"]
    config.steps, config.device, config.dtype = steps, "cpu", dtype
    if seed is not None:
        config.seed = seed
    program = build(ns, config)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        hop = _hop_latency(rank, world)
        record = _train(program, chain, rank, steps, delay)
        record.update(rank=rank, stage=chain.stages[rank], hop_latency_s=hop, delay_s=delay)
        (out / f"pipeline_rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
        torch.save({k: v.detach().clone() for k, v in program.module(chain.stages[rank]).state_dict().items()},
                   out / f"stage{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
        program.close()


def _train(program, chain, j: int, steps: int, delay: float) -> dict:
    """``steps`` pipeline steps of stage ``j``; its timings."""
    stages = stages_of(chain, program.live)
    me, live = stages[j], [program.live[n] for n in chain.stages]
    modules, names = [s.module for s in stages], list(chain.stages)
    pipeline = program._pipeline(live[j])
    draw = program._drawer(chain.stages[0])       # the chain's stream, cast as the run asks
    wire = Wire(me.params[0].dtype)
    heads, trains = set(chain.evaluated()), set(chain.trained_by(j))
    walls, idles, busy = [], [], 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        idle0 = wire.idle
        draw()
        for lv in live[1:]:
            lv.batch = live[0].batch
        features = wire.recv(j - 1) if j > 0 else None
        with me.autocast():
            fw = forward_stage(me.loss, modules, j, features, j in heads, names)
        _sleep(delay)
        if j < chain.k - 1:
            wire.send(fw.out, j + 1)
        grads = [None] * len(me.params)
        if j in heads and not chain.trained_by(j):       # a monitored head: trains itself only
            add_into(grads, head_backward(fw, me.params, False)[0])
        for t in chain.signals(j):
            if t == j:
                head, g = head_backward(fw, me.params, True)
                add_into(grads, head)
            else:
                g = wire.recv(j + 1)
            if j > chain.reach(t):                        # B_in first: the stage below waits for it
                g_in = input_backward(fw, g)
                _sleep(delay)
                wire.send(g_in, j - 1)
            if t == chain.target(j):                      # then B, if l_t trains this stage
                add_into(grads, param_backward(fw, me.params, g))
                _sleep(2 * delay)
        pipeline.run(tree.dense(tuple(grads), me.params), fw.loss.detach() if fw.loss is not None else None)
        wire.flush()
        program.step_count += 1
        wall = time.perf_counter() - t0
        walls.append(wall)
        idles.append(wire.idle - idle0)
        busy += wall - idles[-1]
    program.guard.check()
    return {"steps": steps, "busy_s": busy, "idle_s": wire.idle, "step_wall_s": walls, "step_idle_s": idles,
            "trains": sorted(trains)}


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


# --- the launcher -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(train_py: Path, world: int, steps: int, out: Path, *, seed: int | None = None,
           dtype: str | None = None, delay: float = 0.0, timeout: float | None = None) -> dict:
    """Run the pipeline of ``train_py`` (a program of one chain of ``world`` stages) for
    ``steps`` steps in ``world`` worker processes; their records, gathered into
    ``out/pipeline.json`` and returned. A :class:`PipelineError` when a worker fails (the
    others are stopped)."""
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "mloc.runtime.pipeline", str(train_py), "--world", str(world), "--port",
            str(port), "--steps", str(steps), "--delay", repr(delay), "--out", str(out)]
    base += (["--seed", str(seed)] if seed is not None else []) + (["--dtype", dtype] if dtype else [])
    procs = [subprocess.Popen(base + ["--rank", str(r)], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    failed = _wait(procs, timeout)
    if failed is not None:
        rank, err = failed
        raise PipelineError(f"pipeline worker {rank} failed:\n{err.strip()}")
    ranks = [json.loads((out / f"pipeline_rank{r}.json").read_text()) for r in range(world)]
    record = {"world": world, "steps": steps, "delay_s": delay, "ranks": ranks,
              "period_s": steady_period(ranks)}
    (out / "pipeline.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def _wait(procs: list, timeout: float | None):
    """Wait for every worker; on the first failure stop the others (the processes this
    launcher started) and return (rank, its stderr)."""
    start = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        bad = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        late = timeout is not None and time.monotonic() - start > timeout
        if bad is not None or late:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            r = bad if bad is not None else 0
            return r, ("timed out" if late and bad is None else procs[r].stderr.read())
        if all(c == 0 for c in codes):
            for p in procs:
                p.stderr.read()
            return None
        time.sleep(0.02)


def steady_period(ranks: list[dict], skip: int = 3) -> float:
    """The steady period: the median step wall time of worker 0 after ``skip`` steps."""
    walls = sorted(ranks[0]["step_wall_s"][skip:] or ranks[0]["step_wall_s"])
    return walls[len(walls) // 2]


def run(train_py: Path, ns: dict, config, out: Path, delay: float = 0.0, quiet: bool = False) -> int:
    """`--pipeline`: the pipeline of a compiled program (its `train.py` and namespace) for
    `config.steps` steps into the run folder `out`; a summary line per worker. Exit code:
    0, 1 (a worker's error: the program's), 2 (not a one-chain program)."""
    try:
        chain = chain_of(ns)
    except PipelineError as e:
        print(f"error: {e}\n  = help: {e.help}", file=sys.stderr)
        return 2
    try:
        rec = launch(Path(train_py), chain.k, config.steps, Path(out), seed=config.seed, dtype=config.dtype,
                     delay=delay)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not quiet:
        for r in rec["ranks"]:
            print(f"worker {r['rank']} ({r['stage']}): busy {r['busy_s']:.2f} s, idle {r['idle_s']:.2f} s",
                  file=sys.stderr)
        print(f"{chain.policy()}: {config.steps} steps, steady period {rec['period_s'] * 1e3:.1f} ms; wrote "
              f"{Path(out) / 'pipeline.json'}", file=sys.stderr)
    return 0


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one interlocking-pipeline worker (started by mloc run --pipeline)")
    p.add_argument("train_py", type=Path)
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int), ("--steps", int), ("--seed", int),
                       ("--delay", float), ("--out", Path), ("--dtype", str)):
        p.add_argument(flag, type=kind)
    a = p.parse_args(argv)
    try:
        worker(a.train_py, a.rank, a.world, a.port, a.steps, a.seed, a.dtype, a.delay or 0.0, a.out)
    except (PipelineError, ChainContractError) as e:
        print(f"error: {e}" + (f"\n  = help: {e.help}" if e.help else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
