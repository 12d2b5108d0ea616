"""Model selection during a run: the best checkpoint, early stopping and `summary.json`.

A :class:`Tracker` follows one metric (`max`: higher is better, `min`: lower) through the
evaluations that report it. Evaluation ``v`` at step ``s`` **improves** on the best value
``b`` so far when

    max:  v > b + min_delta          min:  v < b - min_delta

(the first value always improves; a NaN never does). On improvement ``b, step ← v, s``
and the count of evaluations without improvement (``stale``) goes back to 0; otherwise
``stale += 1``. Ties keep the earlier step.

- ``checkpoint best on MODE METRIC`` (min_delta 0): each improvement writes ``best.pt``
  beside ``checkpoint.pt``, atomically and in the same format
  (:func:`~mloc.runtime.program.checkpoint.save_checkpoint`), its payload the program's state plus
  ``"best": {"metric", "mode", "step", "value"}``.
- ``stop when MODE METRIC has not improved [by min_delta] for N evals``: the run stops
  after the evaluation that makes ``stale == N`` (Keras/Lightning ``EarlyStopping`` with
  ``patience = N``), writing ``checkpoint.pt`` at that step. Under ``--nproc`` rank 0's
  decision is broadcast, so every rank stops at the same step.

Both trackers and the last value of every metric are part of ``checkpoint.pt``
(``"selection"``): a resumed run keeps the best so far and the patience count, so it
stops at the step an uninterrupted run stops at, and keeps the same ``best.pt``.

``summary.json`` (:func:`write_summary`), written at the end of a run, on early stop and
on failure::

    {"status": "finished" | "stopped_early" | "interrupted" | "failed", "steps_done": N,
     "best": {"metric": M, "mode": "max", "step": S, "value": V} | null,
     "final": {metric: value, ...}}          (+ "error": text when failed)

(a NaN or infinite value is written as null: the file is strict JSON).

``best`` is the ``checkpoint best`` tracker's (else the ``stop when`` one's, else null);
``final`` holds each evaluation metric's last value.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from mloc.shared.strategy import SHARDED

BEST = "best.pt"
SUMMARY = "summary.json"


@dataclass
class Tracker:
    metric: str
    mode: str                       # "max" | "min"
    min_delta: float = 0.0
    patience: int | None = None     # None: never stops
    value: float | None = None      # best so far
    step: int | None = None         # where it was reached
    stale: int = 0                  # evaluations since, without improvement

    def update(self, step: int, value: float) -> bool:
        """Record the metric's value at ``step``; True when it improves (module docstring)."""
        if math.isnan(value):
            better = False
        elif self.value is None:
            better = True
        elif self.mode == "max":
            better = value > self.value + self.min_delta
        else:
            better = value < self.value - self.min_delta
        if better:
            self.value, self.step, self.stale = float(value), step, 0
        else:
            self.stale += 1
        return better

    @property
    def exhausted(self) -> bool:
        return self.patience is not None and self.stale >= self.patience

    def best(self) -> dict | None:
        if self.value is None:
            return None
        return {"metric": self.metric, "mode": self.mode, "step": self.step, "value": self.value}


@dataclass
class Selection:
    """What a run watches (train.py's ``best`` and ``stop``), and its state."""

    best: Tracker | None = None
    stop: Tracker | None = None
    final: dict[str, float] = field(default_factory=dict)
    stopped_at: int | None = None

    @classmethod
    def watching(cls, best, stop) -> Selection:
        """What train.py's declaration watches (:class:`~mloc.runtime.run.declaration.Criterion`
        s, or None), each followed by a fresh tracker."""
        track = lambda w: None if w is None else Tracker(w.metric, w.mode, w.min_delta, w.patience)  # noqa: E731
        return cls(track(best), track(stop))

    def observe(self, step: int, results: dict[str, float]) -> tuple[bool, bool]:
        """The evaluations' results at ``step``: (write best.pt now, stop now)."""
        self.final.update(results)
        improved = self.best is not None and self.best.metric in results and \
            self.best.update(step, results[self.best.metric])
        stop = False
        if self.stop is not None and self.stop.metric in results:
            self.stop.update(step, results[self.stop.metric])
            stop = self.stop.exhausted
        if stop:
            self.stopped_at = step
        return bool(improved), bool(stop)

    def reason(self) -> str:
        s = self.stop
        by = f" by more than {s.min_delta:g}" if s.min_delta else ""
        return f"{s.metric} has not improved{by} for {s.patience} evaluation{'s' * (s.patience != 1)}"

    def summary_best(self) -> dict | None:
        for t in (self.best, self.stop):
            if t is not None:
                return t.best()
        return None

    # --- checkpointing (plain trees: ints, floats, strings, None) ---------------------------
    def state_dict(self) -> dict:
        return {"best": None if self.best is None else asdict(self.best),
                "stop": None if self.stop is None else asdict(self.stop), "final": dict(self.final)}

    def load_state_dict(self, state: dict | None) -> None:
        """Take the saved state of the trackers that watch the same metric and mode (a
        program whose selection changed starts that tracker afresh)."""
        if not state:
            return
        for key in ("best", "stop"):
            mine, saved = getattr(self, key), state.get(key)
            if mine is not None and saved and (saved["metric"], saved["mode"]) == (mine.metric, mine.mode):
                mine.value, mine.step, mine.stale = saved["value"], saved["step"], int(saved["stale"])
        self.final = {k: float(v) for k, v in (state.get("final") or {}).items()}


def agree(dist, flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (one broadcast; nothing on a single process)."""
    if dist.world == 1:
        return flag
    import torch
    import torch.distributed as tdist
    device = f"cuda:{torch.cuda.current_device()}" if tdist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    tdist.broadcast(t, src=0)
    return bool(t.item())


def anyone(dist, flag: bool) -> bool:
    """Whether ``flag`` is set on any rank, on every rank (one ``all_reduce`` of the
    maximum; nothing on a single process)."""
    if dist.world == 1:
        return flag
    import torch
    import torch.distributed as tdist
    device = f"cuda:{torch.cuda.current_device()}" if tdist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item())


def summary(selection: Selection, status: str, steps_done: int, error: str | None = None) -> dict:
    out = {"status": status, "steps_done": steps_done, "best": selection.summary_best(),
           "final": {k: v if math.isfinite(v) else None for k, v in selection.final.items()}}
    if error is not None:
        out["error"] = error
    return out


def write_summary(directory: Path, record: dict) -> Path:
    """Write ``directory/summary.json`` atomically (a temporary file renamed over it)."""
    path = Path(directory) / SUMMARY
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{SUMMARY}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class Watch:
    """The loop's side of selection for one run: after each round of evaluations, write
    ``best.pt`` on improvement (main process) and say whether to stop (every rank agrees);
    at the end, a closing note and ``summary.json``."""

    def __init__(self, selection: Selection | None, program, out: Path, steps: int, owner: int | None = None,
                 progress=None):
        self.selection = selection or Selection()
        self.program, self.out, self.steps, self.owner, self.progress = program, Path(out), steps, owner, progress
        if program.dist.is_main:
            (self.out / SUMMARY).unlink(missing_ok=True)     # a resumed run is running again

    def state(self) -> dict:
        """What ``checkpoint.pt`` keeps of the selection (``"selection"``)."""
        return {"selection": self.selection.state_dict()}

    def after(self, step: int, results: dict[str, float]) -> bool:
        """Observe ``results`` (the evaluations at ``step``); True: stop the run now."""
        if not results:
            return False
        improved, stop = self.selection.observe(step, results)
        if step >= self.steps:           # the last step: the run finishes anyway
            stop, self.selection.stopped_at = False, None
        gathered = improved and self.program.strategy[0] in SHARDED     # every rank gathers the state
        if improved:
            from mloc.runtime.program.engine import drain
            drain(self.program)         # every rank: background work may be exchanged across ranks
        state = self.program.state_dict() if gathered or (improved and self.program.dist.is_main) else None
        if improved and self.program.dist.is_main:
            from mloc.runtime.program.checkpoint import save_checkpoint
            from mloc.runtime.files.runfolder import check_owner
            if self.owner is not None:
                check_owner(self.out, self.owner)
            save_checkpoint(self.out / BEST, {**state, **self.state(),
                                              "best": self.selection.best.best()}, self.program.name)
        if self.selection.stop is not None:
            stop = agree(self.program.dist, stop)
        if stop and self.progress is not None and hasattr(self.progress, "note"):
            self.progress.note(f"{self.program.name} stopped early at step {step}: {self.selection.reason()}")
        return stop

    def finish(self) -> None:
        """The closing note naming the best step and value, and ``summary.json``."""
        best = self.selection.summary_best()
        if best is not None and self.progress is not None and hasattr(self.progress, "note"):
            kept = f" (kept in {self.out / BEST})" if self.selection.best is not None else ""
            self.progress.note(f"best {best['metric']} = {best['value']:.6g} at step {best['step']}{kept}")
        self.write("stopped_early" if self.selection.stopped_at is not None else "finished")

    def write(self, status: str, error: str | None = None) -> None:
        if self.program.dist.is_main:
            write_summary(self.out, summary(self.selection, status, self.program.step_count, error))


@contextmanager
def failed_summary(selection: Selection, program, out: Path) -> Iterator[None]:
    """Write ``summary.json`` with status ``failed`` (and the error) when the body raises,
    ``interrupted`` for a Ctrl-C that aborted it (the second one), then let the error go on;
    a summary that cannot be written does not hide it."""
    try:
        yield
    except BaseException as err:
        if program.dist.is_main and Path(out).is_dir():
            stopped = isinstance(err, KeyboardInterrupt)
            status, text = ("interrupted", None) if stopped else ("failed", f"{type(err).__name__}: {err}")
            try:
                write_summary(Path(out), summary(selection, status, program.step_count, text))
            except OSError:
                pass
        raise
