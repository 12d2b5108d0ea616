"""One stage's process of `mloc run --pipeline` (:mod:`mloc.runtime.processes.pipeline` says what
the pipeline computes and how it is supervised): the messages between neighbouring
workers (:class:`Wire`), the worker's steps (forward, its head, the gradient signals of
the heads that pass through it, its commit) and its checkpoints. The launcher starts it as
``python -m mloc.runtime.processes.pipeline_stage TRAIN_PY --rank J ...``."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from mloc.runtime.base import tree
from mloc.runtime.program.checkpoint import load_checkpoint, restore_rng, save_checkpoint
from mloc.runtime.run.declaration import declared
from mloc.runtime.base.distributed import is_peer_failure
from mloc.runtime.grad.finite import NonFiniteError
from mloc.runtime.grad.interlock import (ChainContractError, add_into, forward_stage, head_backward, input_backward,
                                    param_backward, stages_of)
from mloc.runtime.run.loop import CHECKPOINT, Stop, Where, resume
from mloc.runtime.processes.pipeline import PipelineError, chain_of, worker_name
from mloc.runtime.processes.ending import end_rank
from mloc.runtime.files.runfolder import check_owner
from mloc.runtime.processes.workers import EXIT_PEER, become_worker, finished
from mloc.runtime.base.usercode import user_error
from mloc.shared.warning import MlocWarning, shown


# --- the messages ------------------------------------------------------------------------------

class Wire:
    """Blocking receives from and sends to the neighbours, timed: ``idle`` accumulates
    the seconds spent waiting. A tensor goes as a header (its shape) then its data; a
    header whose rank is ``STOP`` (-1), with no data, says that the run stops here."""

    STOP = -1

    def __init__(self, dtype: torch.dtype):
        self.dtype, self.idle, self.pending = dtype, 0.0, []

    def send(self, t: torch.Tensor, to: int) -> None:
        t = t.detach().contiguous()
        shape = torch.tensor([t.dim(), *t.shape] + [0] * (7 - t.dim()), dtype=torch.int64)
        self.pending += [dist.isend(shape, to), dist.isend(t, to)]
        self._keep = getattr(self, "_keep", []) + [shape, t]

    def stop(self, to: int) -> None:
        """Tell worker ``to`` that the run stops at this step boundary."""
        shape = torch.tensor([self.STOP] + [0] * 7, dtype=torch.int64)
        self.pending.append(dist.isend(shape, to))
        self._keep = getattr(self, "_keep", []) + [shape]

    def recv(self, frm: int) -> torch.Tensor | None:
        """The next tensor from worker ``frm``; None when it says the run stops."""
        start = time.perf_counter()
        shape = torch.empty(8, dtype=torch.int64)
        dist.recv(shape, frm)
        if int(shape[0]) == self.STOP:
            self.idle += time.perf_counter() - start
            return None
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


def worker(train_py: Path, rank: int, world: int, port: int, steps: int, seed: int | None,
           dtype: str | None, delay: float, out: Path, *, resume_dir: Path | None = None,
           owner: int | None = None, stop: Stop | None = None) -> int:
    """Stage ``rank``'s process (see the module docstring); its exit code. ``owner``: the
    launcher, whose lock on ``out`` is checked before anything is written there."""
    from mloc.runtime.processes.launch import build
    torch.set_num_threads(1)
    declaration = declared(runpy.run_path(str(train_py), run_name="mloc_pipeline_worker"))
    chain = chain_of(declaration)
    config = replace(declaration.defaults, steps=steps, device="cpu", dtype=dtype)   # the program's own
    if seed is not None:
        config = replace(config, seed=seed)
    name = worker_name(rank, world, chain.stages[rank])
    try:
        program = build(declaration, config)
    except Exception as err:  # noqa: BLE001 - the user's code raising while the program is built
        return user_error(err, f"building the program on {name}")
    try:
        if resume_dir is not None:
            resume(program, resume_dir)
            rngs = load_checkpoint(Path(resume_dir) / CHECKPOINT, program.name).get("pipeline", {}).get("rng")
            if rngs is not None and len(rngs) == world:
                restore_rng(rngs[rank])     # this stage's own random stream (dropout, ...)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        try:
            return _run(program, chain, declaration, rank, world, steps, delay, Path(out), owner, stop or Stop(note=False),
                        name, dtype)
        finally:
            dist.destroy_process_group()
    finally:
        program.close()


def _run(program, chain, declaration, rank: int, world: int, steps: int, delay: float, out: Path,
         owner: int | None, stop: Stop, name: str, dtype: str | None) -> int:
    """Train, checkpoint and write this worker's files; its exit code."""
    where = Where()
    every = declaration.intervals.checkpoint_every
    try:
        hop = _hop_latency(rank, world)
        record = _train(program, chain, rank, steps, delay, stop, where,
                        lambda: _checkpoint(program, chain.stages[rank], rank, world, out, owner), every)
    except NonFiniteError as e:
        print(f"error: {e} on {name}\n  = help: {e.help}", file=sys.stderr)
        return 1
    except ChainContractError:
        raise
    except Exception as err:  # noqa: BLE001 - a neighbour gone, or the program's own code raising
        if is_peer_failure(err):
            return EXIT_PEER
        return user_error(err, f"{where.text} on {name}", dtype)
    record.update(rank=rank, stage=chain.stages[rank], hop_latency_s=hop, delay_s=delay)
    if owner is not None:
        check_owner(out, owner)
    (out / f"pipeline_rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    torch.save({k: v.detach().clone() for k, v in program.module(chain.stages[rank]).state_dict().items()},
               out / f"stage{rank}.pt")
    dist.barrier()
    if record["stopped_at"] is None:
        return 0
    if rank == 0:
        more = f" --steps {steps}" if steps != declaration.defaults.steps else ""
        print(f"interrupted at step {record['stopped_at']} of {steps}: wrote {out / CHECKPOINT}; continue with `--pipeline --resume {out}{more}`", file=sys.stderr)
    return 130


def _checkpoint(program, stage: str, rank: int, world: int, out: Path, owner: int | None) -> None:
    """Every worker: send this stage's state to worker 0, which writes ``out/checkpoint.pt``
    (each problem's state from the worker that trains it; see the module docstring)."""
    program.guard.check()
    state = program.state_dict()
    mine = {"problem": (stage, state["problems"][stage]), "rng": state["rng"]}
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank == 0:
        for g in gathered:
            n, problem = g["problem"]
            state["problems"][n] = problem
        state["pipeline"] = {"world": world, "rng": [g["rng"] for g in gathered]}
        if owner is not None:
            check_owner(out, owner)
        save_checkpoint(out / CHECKPOINT, state, program.name)
    dist.barrier()


def _train(program, chain, j: int, steps: int, delay: float, stop: Stop | None = None, where: Where | None = None,
           checkpoint=None, every: int | None = None) -> dict:
    """Pipeline steps of stage ``j`` from the program's step up to ``steps`` (fewer when
    ``stop`` is asked: worker 0 decides at a step boundary and the stop header travels up
    the chain); ``checkpoint()`` every ``every`` steps and at the end. Its timings."""
    stages = stages_of(chain, program.live)
    me, live = stages[j], [program.live[n] for n in chain.stages]
    modules, names = [s.module for s in stages], list(chain.stages)
    pipeline = program.pipeline(chain.stages[j])
    draw = program.drawer(chain.stages[0])       # the chain's stream, cast as the run asks
    wire = Wire(me.params[0].dtype)
    heads, trains = set(chain.evaluated()), set(chain.trained_by(j))
    walls, idles, busy, start, stopped = [], [], 0.0, program.step_count, None
    where = where or Where()
    for step in range(start, steps):
        where.text = f"step {step + 1}"
        t0 = time.perf_counter()
        idle0 = wire.idle
        if j == 0 and stop is not None and stop.requested and step > start:
            wire.stop(1)                                  # all stop after the step before
            stopped = step
            break
        features = wire.recv(j - 1) if j > 0 else None
        if j > 0 and features is None:
            if j < chain.k - 1:
                wire.stop(j + 1)
            stopped = step
            break
        draw()
        for lv in live[1:]:
            lv.batch = live[0].batch
        with me.autocast():
            fw = forward_stage(me.loss, modules, j, features, j in heads, names)
        _sleep(delay)
        if j < chain.k - 1:
            wire.send(fw.out, j + 1)
        grads = _backward(chain, j, fw, me.params, wire, j in heads, delay)
        pipeline.run(tree.dense(tuple(grads), me.params), fw.loss.detach() if fw.loss is not None else None)
        wire.flush()
        program.step_count += 1
        wall = time.perf_counter() - t0
        walls.append(wall)
        idles.append(wire.idle - idle0)
        busy += wall - idles[-1]
        done = step + 1
        if checkpoint is not None and every and done % every == 0 and done != steps:
            where.text = f"the checkpoint after step {done}"
            checkpoint()
    wire.flush()
    program.guard.check()
    if checkpoint is not None:
        where.text = f"the checkpoint after step {program.step_count}"
        checkpoint()
    return {"steps": len(walls), "busy_s": busy, "idle_s": wire.idle, "step_wall_s": walls, "step_idle_s": idles,
            "trains": sorted(trains), "stopped_at": stopped}


def _backward(chain, j: int, fw, params, wire: Wire, head: bool, delay: float) -> list:
    """Stage ``j``'s gradients of one step, and the signals it passes down: for every head
    t whose signal passes through it (its own first), B_in first (worker j-1 waits for it),
    then B when l_t trains this stage; a monitored head (``head``, training no stage)
    trains itself only."""
    grads = [None] * len(params)
    if head and not chain.trained_by(j):
        add_into(grads, head_backward(fw, params, False)[0])
    for t in chain.signals(j):
        if t == j:
            own, g = head_backward(fw, params, True)
            add_into(grads, own)
        else:
            g = wire.recv(j + 1)
        if j > chain.reach(t):
            g_in = input_backward(fw, g)
            _sleep(delay)
            wire.send(g_in, j - 1)
        if t == chain.target(j):
            add_into(grads, param_backward(fw, params, g))
            _sleep(2 * delay)
    return grads


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _main(argv: list[str] | None = None) -> int:
    """A worker's entry point (``python -m mloc.runtime.processes.pipeline_stage``, started by the launcher).
    Exit codes as a ``--nproc`` worker's: 0, 1 (the program's error), 2 (a folder,
    checkpoint or I/O error), EXIT_PEER (a neighbour failed first), 101 (a bug in mloc),
    130 (stopped by SIGINT, with a checkpoint; or aborted by a second one)."""
    p = argparse.ArgumentParser(description="one interlocking-pipeline worker (started by mloc run --pipeline)")
    p.add_argument("train_py", type=Path)
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int), ("--steps", int), ("--seed", int),
                       ("--delay", float), ("--out", Path), ("--dtype", str), ("--resume", Path),
                       ("--launched-by", int)):
        p.add_argument(flag, type=kind)
    p.add_argument("--locked", action="store_true", help="the launcher holds the lock of --out (mloc run)")
    a = p.parse_args(argv)
    if a.launched_by is not None:
        become_worker()                 # it never outlives its launcher; a fatal signal shows its stack
        if os.getppid() != a.launched_by:
            return EXIT_PEER            # the launcher is gone already: write nothing
    from mloc.runtime.processes.launch import _FOLDER_ERRORS, _say
    stop = Stop(note=False)             # the launcher says that the run is stopping
    try:
        with stop.handling((signal.SIGINT,)), shown(a.rank, a.world, alike=False):     # the stages differ
            return finished(worker(a.train_py, a.rank, a.world, a.port, a.steps, a.seed, a.dtype, a.delay or 0.0,
                                   a.out, resume_dir=a.resume, owner=a.launched_by if a.locked else None, stop=stop))
    except KeyboardInterrupt:           # a second SIGINT: the launcher kills us and says so
        return 130
    except (PipelineError, ChainContractError) as e:
        _say(e)
        return 1
    except _FOLDER_ERRORS as e:
        _say(e)
        return 2
    except MlocWarning as e:            # made an error by -W error while resuming
        return user_error(e, f"the resume on {worker_name(a.rank, a.world)}")
    except Exception as e:  # noqa: BLE001 - the last line of defence, as in `mloc run`
        if is_peer_failure(e):
            return EXIT_PEER
        import traceback
        traceback.print_exc()
        print(f"error[E900]: internal error: {type(e).__name__}: {e}\n  = note: this is a bug in mloc, not in "
              "your program; please report it with the traceback above", file=sys.stderr)
        return 101


if __name__ == "__main__":
    end_rank(_main())                   # a rank ends without finalization (mloc.runtime.processes.ending)
