"""Interlocking backpropagation as a real pipeline: one process per stage.

``mloc run --pipeline`` starts K workers for a program
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
order as the one-process simulation (:class:`mloc.runtime.grad.interlock.ChainStep`), so both
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
one-process run would (:func:`mloc.runtime.program.checkpoint.save_checkpoint`): each problem's
parameters, optimizer state and step count from the worker that trains it, the data
position from worker 0 (every worker draws the same stream), and every worker's RNG state
under ``"pipeline"``. ``mloc run --pipeline --resume DIR`` continues from it (each worker
takes back its own RNG), and so can the one-process simulation (``mloc run --resume DIR``).

**Supervision** is ``--nproc``'s (:func:`mloc.runtime.processes.workers.supervise`): the workers
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

import json
import os
import sys
from pathlib import Path

from mloc.runtime.run.loop import CHECKPOINT
from mloc.runtime.processes.workers import Outcome, exit_code, free_port, supervise


class PipelineError(Exception):
    """A program the pipeline cannot run (not one chain), or a worker that failed."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


def chain_of(declaration):
    """The one chain of a program (its :class:`~mloc.runtime.run.declaration.Declaration`) that
    is nothing but that chain."""
    chains = declaration.chains
    names = {s.name for s in declaration.problems}
    if len(chains) != 1 or set(chains[0].stages) != names:
        raise PipelineError("--pipeline runs a program that is one interlocking chain, and nothing else",
                            "train this program without --pipeline")
    return chains[0]


def worker_name(rank: int, world: int, stage: str | None = None) -> str:
    """How reports name a worker: ``pipeline worker 1 of 3 (stage `stage2`)``."""
    return f"pipeline worker {rank} of {world}" + (f" (stage `{stage}`)" if stage else "")


_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def start(train_py: Path, world: int, steps: int, out: Path, *, seed: int | None = None,
          dtype: str | None = None, delay: float = 0.0, resume_dir: Path | None = None,
          stages: tuple[str, ...] | None = None, timeout: float | None = None, locked: bool = False) -> Outcome:
    """Run the pipeline of ``train_py`` (a program of one chain of ``world`` stages, named
    ``stages``) up to step ``steps`` in ``world`` workers supervised as ``--nproc``'s
    (:func:`mloc.runtime.processes.workers.supervise`); on success their records are gathered into
    ``out/pipeline.json``. ``locked``: ``out`` is a run folder whose lock this process holds
    (``mloc run --pipeline``), which the workers check before they write there. The
    outcome: exit code and the one report to show."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN}    # not a data-parallel rank
    env["OMP_NUM_THREADS"] = "1"
    base = [sys.executable, "-m", "mloc.runtime.processes.pipeline_stage", str(train_py), "--world", str(world), "--port",
            str(port), "--steps", str(steps), "--delay", repr(delay), "--out", str(out),
            "--launched-by", str(os.getpid())]
    base += (["--seed", str(seed)] if seed is not None else []) + (["--dtype", dtype] if dtype else [])
    base += ["--resume", str(resume_dir)] if resume_dir is not None else []
    base += ["--locked"] if locked else []      # `out` is a run folder this process holds the lock of
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


def run(train_py: Path, declaration, config, out: Path, delay: float = 0.0, quiet: bool = False,
        resume_dir: Path | None = None) -> int:
    """`--pipeline`: the pipeline of a compiled program (its `train.py` and declaration) up to
    step `config.steps` (from `resume_dir`'s checkpoint if given) into the run folder `out`;
    a summary line per worker. Exit code: 0, 1 (a worker's error: the program's), 2 (not
    a one-chain program; a folder, checkpoint or I/O error), 101 (a bug in mloc), 130
    (interrupted, with a checkpoint)."""
    try:
        chain = chain_of(declaration)
    except PipelineError as e:
        print(f"error: {e}\n  = help: {e.help}", file=sys.stderr)
        return 2
    if not quiet:
        print(f"training {declaration.name} as a pipeline: {chain.k} processes, one per stage -> {out}", file=sys.stderr)
    outcome = start(Path(train_py), chain.k, config.steps, Path(out), seed=config.seed, dtype=config.dtype,
                    delay=delay, resume_dir=resume_dir, stages=tuple(chain.stages), locked=True)
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
