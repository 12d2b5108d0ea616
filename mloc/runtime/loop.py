"""The training loop around `Program.outer_step`: logging, evaluation, checkpoints, resume.

    for step in range(start, steps):
        program.outer_step()
        every log_every:        check for NaN/Inf (one host sync), log losses, update progress
        every eval interval:    run the evaluation calls
        every checkpoint_every: check, then write `checkpoint.pt` atomically

A checkpoint is written only after the finiteness check passed, so when a loss or
hypergradient turns NaN/Inf the run stops with an error naming the problem and step, and
the last checkpoint on disk is the last good one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mloc.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mloc.runtime.engine import Program
from mloc.runtime.metrics import MetricsWriter

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Intervals:
    log_every: int = 10
    checkpoint_every: int | None = None


def checkpoint_path(out: Path) -> Path:
    return Path(out) / CHECKPOINT


def save(program: Program, out: Path) -> Path:
    path = checkpoint_path(out)
    if program.dist.is_main:
        save_checkpoint(path, program.state_dict(), program.name)
    program.dist.barrier()
    return path


def resume(program: Program, directory: Path) -> int:
    """Load `directory/checkpoint.pt` into `program`; returns the step to continue from."""
    path = checkpoint_path(directory)
    state = load_checkpoint(path, program.name)
    try:
        program.load_state_dict(state)
    except CheckpointError:
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as e:
        raise CheckpointError(path, f"{path} does not match this program ({type(e).__name__}: {e})",
                              "the program changed since the checkpoint was written; start again without --resume") from None
    return program.step_count


def train(program: Program, steps: int, out: Path, intervals: Intervals, progress=None) -> dict:
    """Run until `steps` outer steps are done; returns the final losses and evaluations."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = MetricsWriter(out / "metrics.jsonl", enabled=program.dist.is_main)
    start, t0, last = program.step_count, time.perf_counter(), {}
    for step in range(start, steps):
        program.outer_step()
        done = step + 1
        if done % intervals.log_every == 0 or done == steps:
            program.guard.check()
            last = program.losses()
            rate = (done - start) / max(time.perf_counter() - t0, 1e-9)
            for name, value in last.items():
                metrics.write(done, name, loss=value)
            metrics.write(done, "*", steps_per_s=rate)
            if progress:
                progress(done, steps, last, rate)
        due = [label for every, label, _ in program.evaluations if done % every == 0 or done == steps]
        for label, value in (program.evaluate(due) if due else {}).items():
            last[label] = value
            metrics.write(done, "*", eval=label, value=value)
            if progress is not None and hasattr(progress, "note"):
                progress.note(f"{program.name} step {done}: {label} = {value:.4g}")
        if intervals.checkpoint_every and done % intervals.checkpoint_every == 0 and done != steps:
            program.guard.check()
            save(program, out)
    program.guard.check()
    save(program, out)
    metrics.close()
    return last
