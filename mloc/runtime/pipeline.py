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
step's wall time, and ``stage<j>.pt`` each stage's final parameters.

**Checkpoints.** At the end, every ``checkpoint every N`` steps and where a stop was asked,
the workers gather their stages' states at worker 0 (``gather_object``, at a step
boundary: every worker has committed that step), which writes ``checkpoint.pt`` as a
one-process run would (:func:`mloc.runtime.checkpoint.save_checkpoint`): each problem's
parameters, optimizer state and step count from the worker that trains it, the data
position from worker 0 (every worker draws the same stream), and every worker's RNG state
under ``"pipeline"``. ``mloc run --pipeline --resume DIR`` continues from it (each worker
takes back its own RNG), and so can the one-process simulation (``mloc run --resume DIR``).

**Supervision** is ``--nproc``'s (:func:`mloc.runtime.workers.supervise`): the workers
die with the launcher (``PR_SET_PDEATHSIG``; one whose launcher is gone when it starts
writes nothing, and each checks the run folder's lock before it writes), run in a session
of their own, write stderr to files (worker 0's also shown live), and a failure is
reported once: the diagnostic of the worker that failed first, naming it; the others,
whose messages broke because of it, exit with :data:`EXIT_PEER` and say nothing. Ctrl-C
or SIGTERM to the launcher sends each worker one SIGINT: worker 0 stops at the next step
boundary and tells worker 1 with a stop header instead of its features, which each worker
passes on, so all stop after the same step; they write the checkpoint and worker 0 says
how to continue (exit 130). A second Ctrl-C kills them. Not supported in this mode:
evaluations during training, data parallelism.
"""

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

from mloc.runtime import tree
from mloc.runtime.checkpoint import load_checkpoint, restore_rng, save_checkpoint
from mloc.runtime.distributed import is_peer_failure
from mloc.runtime.interlock import (
    ChainContractError,
    add_into,
    forward_stage,
    head_backward,
    input_backward,
    param_backward,
    stages_of,
)
from mloc.runtime.loop import CHECKPOINT, Stop, Where, resume
from mloc.runtime.metrics import NonFiniteError
from mloc.runtime.runfolder import check_owner
from mloc.runtime.workers import (
    EXIT_PEER,
    Outcome,
    _free_port,
    die_with_parent,
    exit_code,
    supervise,
)


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


# --- one worker ------------------------------------------------------------------------------

def worker_name(rank: int, world: int, stage: str | None = None) -> str:
    """How reports name a worker: ``pipeline worker 1 of 3 (stage `stage2`)``."""
    return f"pipeline worker {rank} of {world}" + (f" (stage `{stage}`)" if stage else "")


def worker(train_py: Path, rank: int, world: int, port: int, steps: int, seed: int | None,
           dtype: str | None, delay: float, out: Path, *, resume_dir: Path | None = None,
           owner: int | None = None, stop: Stop | None = None) -> int:
    """Stage ``rank``'s process (see the module docstring); its exit code. ``owner``: the
    launcher, whose lock on ``out`` is checked before anything is written there."""
    from mloc.runtime.launch import _user_error, build
    torch.set_num_threads(1)
    ns = runpy.run_path(str(train_py), run_name="mloc_pipeline_worker")
    chain = chain_of(ns)
    config = replace(ns["DEFAULTS"], steps=steps, device="cpu", dtype=dtype)   # DEFAULTS: the program's own
    if seed is not None:
        config = replace(config, seed=seed)
    name = worker_name(rank, world, chain.stages[rank])
    try:
        program = build(ns, config)
    except Exception as err:  # noqa: BLE001 - the user's code raising while the program is built
        return _user_error(err, f"building the program on {name}")
    try:
        if resume_dir is not None:
            resume(program, resume_dir)
            rngs = load_checkpoint(Path(resume_dir) / CHECKPOINT, program.name).get("pipeline", {}).get("rng")
            if rngs is not None and len(rngs) == world:
                restore_rng(rngs[rank])     # this stage's own random stream (dropout, ...)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        try:
            return _run(program, chain, ns, rank, world, steps, delay, Path(out), owner, stop or Stop(note=False),
                        name, dtype)
        finally:
            dist.destroy_process_group()
    finally:
        program.close()


def _run(program, chain, ns: dict, rank: int, world: int, steps: int, delay: float, out: Path,
         owner: int | None, stop: Stop, name: str, dtype: str | None) -> int:
    """Train, checkpoint and write this worker's files; its exit code."""
    from mloc.runtime.launch import _user_error
    where = Where()
    every = ns["INTERVALS"].get("checkpoint_every")
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
        return _user_error(err, f"{where.text} on {name}", dtype)
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
        more = f" --steps {steps}" if steps != ns["DEFAULTS"].steps else ""
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
    pipeline = program._pipeline(live[j])
    draw = program._drawer(chain.stages[0])       # the chain's stream, cast as the run asks
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


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


# --- the launcher -------------------------------------------------------------------------------

_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def start(train_py: Path, world: int, steps: int, out: Path, *, seed: int | None = None,
          dtype: str | None = None, delay: float = 0.0, resume_dir: Path | None = None,
          stages: tuple[str, ...] | None = None, timeout: float | None = None) -> Outcome:
    """Run the pipeline of ``train_py`` (a program of one chain of ``world`` stages, named
    ``stages``) up to step ``steps`` in ``world`` workers supervised as ``--nproc``'s
    (:func:`mloc.runtime.workers.supervise`); on success their records are gathered into
    ``out/pipeline.json``. The outcome: exit code and the one report to show."""
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN}    # not a data-parallel rank
    env["OMP_NUM_THREADS"] = "1"
    base = [sys.executable, "-m", "mloc.runtime.pipeline", str(train_py), "--world", str(world), "--port",
            str(port), "--steps", str(steps), "--delay", repr(delay), "--out", str(out),
            "--launched-by", str(os.getpid())]
    base += (["--seed", str(seed)] if seed is not None else []) + (["--dtype", dtype] if dtype else [])
    base += ["--resume", str(resume_dir)] if resume_dir is not None else []
    names = [worker_name(r, world, stages[r] if stages else None) for r in range(world)]
    outcome = supervise([base + ["--rank", str(r)] for r in range(world)], [env] * world, names, timeout,
                        stopping="stopping after this step to write a checkpoint; Ctrl-C again to abort without one")
    if outcome.code == 0:
        ranks = [json.loads((out / f"pipeline_rank{r}.json").read_text()) for r in range(world)]
        record = {"world": world, "steps": steps, "delay_s": delay, "ranks": ranks,
                  "period_s": steady_period(ranks)}
        (out / "pipeline.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return outcome


def launch(train_py: Path, world: int, steps: int, out: Path, **options) -> dict:
    """:func:`start`, then the gathered record (``out/pipeline.json``); a
    :class:`PipelineError` with the outcome's report when the run did not succeed."""
    outcome = start(train_py, world, steps, out, **options)
    if outcome.code != 0:
        raise PipelineError(outcome.report or f"the pipeline ended with exit code {outcome.code}")
    return json.loads((out / "pipeline.json").read_text())


def steady_period(ranks: list[dict], skip: int = 3) -> float:
    """The steady period: the median step wall time of worker 0 after ``skip`` steps."""
    walls = sorted(ranks[0]["step_wall_s"][skip:] or ranks[0]["step_wall_s"] or [0.0])
    return walls[len(walls) // 2]


def run(train_py: Path, ns: dict, config, out: Path, delay: float = 0.0, quiet: bool = False,
        resume_dir: Path | None = None) -> int:
    """`--pipeline`: the pipeline of a compiled program (its `train.py` and namespace) up to
    step `config.steps` (from `resume_dir`'s checkpoint if given) into the run folder `out`;
    a summary line per worker. Exit code: 0, 1 (a worker's error: the program's), 2 (not
    a one-chain program; a folder, checkpoint or I/O error), 101 (a bug in mloc), 130
    (interrupted, with a checkpoint)."""
    try:
        chain = chain_of(ns)
    except PipelineError as e:
        print(f"error: {e}\n  = help: {e.help}", file=sys.stderr)
        return 2
    if not quiet:
        print(f"training {ns['NAME']} as a pipeline: {chain.k} processes, one per stage -> {out}", file=sys.stderr)
    outcome = start(Path(train_py), chain.k, config.steps, Path(out), seed=config.seed, dtype=config.dtype,
                    delay=delay, resume_dir=resume_dir, stages=tuple(chain.stages))
    if outcome.report:
        print(outcome.report, file=sys.stderr)
    if outcome.code != 0:
        return exit_code(outcome.code)
    rec = json.loads((Path(out) / "pipeline.json").read_text())
    if not quiet:
        for r in rec["ranks"]:
            print(f"worker {r['rank']} ({r['stage']}): busy {r['busy_s']:.2f} s, idle {r['idle_s']:.2f} s",
                  file=sys.stderr)
        print(f"{chain.policy()}: {config.steps} steps, steady period {rec['period_s'] * 1e3:.1f} ms; wrote "
              f"{Path(out) / 'pipeline.json'} and {Path(out) / CHECKPOINT}", file=sys.stderr)
    return 0


def _main(argv: list[str] | None = None) -> int:
    """A worker's entry point (``python -m mloc.runtime.pipeline``, started by the launcher).
    Exit codes as a ``--nproc`` worker's: 0, 1 (the program's error), 2 (a folder,
    checkpoint or I/O error), EXIT_PEER (a neighbour failed first), 101 (a bug in mloc),
    130 (stopped by SIGINT, with a checkpoint; or aborted by a second one)."""
    p = argparse.ArgumentParser(description="one interlocking-pipeline worker (started by mloc run --pipeline)")
    p.add_argument("train_py", type=Path)
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int), ("--steps", int), ("--seed", int),
                       ("--delay", float), ("--out", Path), ("--dtype", str), ("--resume", Path),
                       ("--launched-by", int)):
        p.add_argument(flag, type=kind)
    a = p.parse_args(argv)
    if a.launched_by is not None:
        die_with_parent()               # a worker never outlives its launcher
        if os.getppid() != a.launched_by:
            return EXIT_PEER            # the launcher is gone already: write nothing
    from mloc.runtime.launch import _FOLDER_ERRORS, _say
    stop = Stop(note=False)             # the launcher says that the run is stopping
    try:
        with stop.handling((signal.SIGINT,)):
            return worker(a.train_py, a.rank, a.world, a.port, a.steps, a.seed, a.dtype, a.delay or 0.0, a.out,
                          resume_dir=a.resume, owner=a.launched_by, stop=stop)
    except KeyboardInterrupt:           # a second SIGINT: the launcher kills us and says so
        return 130
    except (PipelineError, ChainContractError) as e:
        _say(e)
        return 1
    except _FOLDER_ERRORS as e:
        _say(e)
        return 2
    except Exception as e:  # noqa: BLE001 - the last line of defence, as in `mloc run`
        if is_peer_failure(e):
            return EXIT_PEER
        import traceback
        traceback.print_exc()
        print(f"error[E900]: internal error: {type(e).__name__}: {e}\n  = note: this is a bug in mloc, not in "
              "your program; please report it with the traceback above", file=sys.stderr)
        return 101


if __name__ == "__main__":
    raise SystemExit(_main())
