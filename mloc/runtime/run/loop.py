"""The training loop around `Program.outer_step`: logging, evaluation, checkpoints, resume.

    for step in range(start, steps):
        program.outer_step()
        every log_every:        check for NaN/Inf (one host sync), log the interval's mean
                                losses, learning rates and gradient norms, update progress
        every eval interval:    run the evaluation calls
        every checkpoint_every: check, then write `checkpoint.pt` atomically

Ctrl-C or SIGTERM (:class:`Stop`) ends the run at the next step boundary (under
`--nproc`, the next log step, where the ranks agree), with a checkpoint written there
as `checkpoint every` would write it, so `--resume` continues bitwise as if uninterrupted;
`summary.json` says ``interrupted``. A second Ctrl-C raises KeyboardInterrupt at once.

A checkpoint is written only after the finiteness check passed, and evaluations run only
after it: when a loss, a gradient, a hypergradient or anything a step committed (the
parameters, an optimizer statistic, a root) turns NaN/Inf, the run stops with an error
naming the problem and step, and the last checkpoint on disk is the last good one
(:meth:`~mloc.runtime.program.engine.Program.state_dict` verifies the whole state besides).

`metrics.jsonl` is one history: a run from step 0 starts it empty, a resumed run drops
the records past its checkpoint's step (those the resumed steps write again). mloc's own
writes that fail (a full disk) raise :class:`~mloc.runtime.files.runfolder.RunIOError`; the
user's code raising is told apart by :class:`Where`, which says what the loop was doing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mloc.runtime.program import sharded
from mloc.runtime.program.checkpoint import CheckpointError, save_checkpoint
from mloc.runtime.program.engine import Program, drain
from mloc.shared.strategy import SHARDED
from mloc.shared.warning import MlocWarning
from mloc.runtime.files.loggers import open_loggers
from mloc.runtime.run.metrics import MetricsWriter
from mloc.runtime.run.records import log_train
from mloc.runtime.files.runfiles import truncate_metrics
from mloc.runtime.run.compiling import CompileWatch
from mloc.runtime.files.runfolder import RunIOError, check_owner
from mloc.runtime.run.selection import Selection, Watch, anyone

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Intervals:
    log_every: int = 10
    checkpoint_every: int | None = None


def checkpoint_path(out: Path) -> Path:
    return Path(out) / CHECKPOINT


class Where:
    """What the loop is doing, for error messages: ``step 12``, ``the evaluations after step 10``."""

    text = "the first step"


class Stop:
    """Ctrl-C (SIGINT) or SIGTERM as a request to stop at the next step boundary, where
    :func:`train` writes a checkpoint; a second signal raises KeyboardInterrupt at once
    (no checkpoint for it). :attr:`at` is the step the run stopped at; `note` says on
    stderr that the run is stopping (the `--nproc` launcher says it for its workers)."""

    def __init__(self, note: bool = True):
        self.requested, self.note, self.at = False, note, None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.note:               # os.write: safe in a handler that interrupts a print
            os.write(2, b"\nstopping after this step to write a checkpoint; Ctrl-C again to abort without one\n")

    @contextmanager
    def handling(self, signals: tuple[int, ...]):
        """Handle `signals` while the body runs (in the main thread; elsewhere, not at all)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handler) for s in signals}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    def due(self, dist, logged: bool) -> bool:
        """Stop now? One process: when asked. Several: at a log step, when any rank was
        asked (on several machines, Ctrl-C reaches one machine's workers only)."""
        if dist.world == 1:
            return self.requested
        return logged and anyone(dist, self.requested)


def save(program: Program, out: Path, owner: int | None = None, extra: dict | None = None) -> Path:
    """Write `out/checkpoint.pt` on the main process (after checking that the run folder is
    still locked by `owner`, when given), `extra` entries added to the program's state
    (the selection's); every process waits for it. A sharded checkpoint under `zero` when
    the run asks (`checkpoint_form`: :mod:`mloc.runtime.program.sharded`); a gathered one
    removes the shards of one written before it in `out`."""
    if sharded.wanted(program):
        return sharded.save(program, out, owner, extra)
    path = checkpoint_path(out)
    if program.dist.is_main:
        if owner is not None:
            check_owner(Path(out), owner)
    drain(program)              # every rank: background work may be exchanged across ranks
    state = program.state_dict() if program.dist.is_main or program.strategy[0] in SHARDED else None   # gathered
    if program.dist.is_main:
        save_checkpoint(path, {**state, **(extra or {})}, program.name)
        sharded.clean(Path(out))
    program.dist.barrier()
    return path


def resume(program: Program, directory: Path, selection: Selection | None = None, where: Where | None = None) -> int:
    """Load `directory/checkpoint.pt` (and its shards, when sharded) into `program` (and its
    best-so-far and patience count into `selection`); returns the step to continue from.
    Anything that fails while restoring is a :class:`CheckpointError` naming the file (but
    an mloc warning made an error: the run's to say). `where` says the loop is resuming."""
    path = checkpoint_path(directory)
    if where is not None:
        where.text = f"the resume from {path}"
    state = sharded.load(program, Path(directory))
    try:
        program.load_state_dict(state)
        if selection is not None:
            selection.load_state_dict(state.get("selection"))
        program.compiling.restore(state.get("compile"))
    except (CheckpointError, MlocWarning):     # a warning made an error (-W error): not the file's fault
        raise
    except Exception as e:  # noqa: BLE001 - a checksummed file that still does not restore
        raise CheckpointError(path, f"{path} does not match this program ({type(e).__name__}: {e})",
                              "the program changed since the checkpoint was written; start again without --resume") from None
    return program.step_count


class _Metrics(MetricsWriter):
    """`MetricsWriter` (with the `loggers` named, opened on the main process) whose failures
    are mloc's I/O errors, naming the file."""

    def __init__(self, path: Path, enabled: bool, loggers: tuple[str, ...] = (), start: int = 0):
        try:
            opened = open_loggers(loggers, path.parent, start, _config(path.parent)) if enabled else ()
            super().__init__(path, enabled=enabled, loggers=opened)
        except OSError as e:
            raise RunIOError(e.filename or path, e) from None

    def write(self, step: int, problem: str, kind: str = "train", **values) -> None:
        try:
            super().write(step, problem, kind, **values)
        except OSError as e:
            raise RunIOError(self.path, e) from None


def _config(out: Path) -> dict | None:
    """The run's `config.json` record (for W&B's run config), if there is one."""
    try:
        return json.loads((out / "config.json").read_text(encoding="utf-8")).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def _evaluations(program: Program, done: int, steps: int, logged: bool, metrics, progress, last: dict) -> dict:
    """The evaluations due after step `done`, written to the metrics, shown, and kept in
    `last`; the steps' watches are read first (no evaluation, nor best.pt, of a state a
    failed step wrote)."""
    due = [e.name for e in program.evaluations if done % e.every == 0 or done == steps]
    if due and not logged:
        program.guard.check()
    results = program.evaluate(due) if due else {}
    for label, value in results.items():
        last[label] = value
        metrics.write(done, "*", "eval", eval=label, value=value)
        if progress is not None and hasattr(progress, "note"):
            progress.note(f"{program.name} step {done}: {label} = {value:.4g}")
    return results


def train(program: Program, steps: int, out: Path, intervals: Intervals, progress=None,
          owner: int | None = None, where: Where | None = None, loggers: tuple[str, ...] = (),
          selection: Selection | None = None, stop: Stop | None = None) -> dict:
    """Run until `steps` outer steps are done; returns the final losses and evaluations.
    `owner`: the pid that must hold the run folder's lock at every checkpoint; `loggers`:
    the `--logger` names (:mod:`mloc.runtime.files.loggers`), besides `metrics.jsonl`; `selection`:
    the best checkpoint and early stopping (:mod:`mloc.runtime.run.selection`); `stop`: ends
    the run early with a checkpoint (its `at` set) when a signal asks."""
    out, where = Path(out), where or Where()
    start, t0, last = program.step_count, time.perf_counter(), {}
    if program.dist.is_main:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunIOError(e.filename or out, e, "create") from None
        truncate_metrics(out, start)
    metrics = _Metrics(out / "metrics.jsonl", enabled=program.dist.is_main, loggers=loggers, start=start)
    rate, guard = 0.0, program.guard
    watch = Watch(selection, program, out, steps, owner, progress)
    compiling = CompileWatch(program, out, start, steps, progress)
    for done in range(start + 1, steps + 1):
        where.text = f"step {done}"
        logged = guard.norms.sampling = done % intervals.log_every == 0 or done == steps
        began = time.perf_counter()
        with compiling.around(done):
            program.outer_step()
        compiling.after(done, time.perf_counter() - began)
        if logged:
            guard.check()
            rate = (done - start) / max(time.perf_counter() - t0, 1e-9)
            last = log_train(metrics, program, done, rate)
            if progress:
                progress(done, steps, last, rate)
        where.text = f"the evaluations after step {done}"
        results = _evaluations(program, done, steps, logged, metrics, progress, last)
        if watch.after(done, results):
            break
        if intervals.checkpoint_every and done % intervals.checkpoint_every == 0 and done != steps:
            program.guard.check()
            save(program, out, owner, {**watch.state(), **program.compiling.state()})
        if stop is not None and done < steps and stop.due(program.dist, logged):
            stop.at = done
            break
    guard.norms.sampling = False
    program.guard.check()
    compiling.finish()
    save(program, out, owner, {**watch.state(), **program.compiling.state()})
    if stop is not None and stop.at is not None:
        watch.write("interrupted")
        metrics.close()
        return last
    watch.finish()
    metrics.write(program.step_count, "*", "summary", steps_per_s=rate, seconds=time.perf_counter() - t0,
                  final={(f"{k}/loss" if k in program.live else k): v for k, v in last.items()})
    metrics.close()
    return last
