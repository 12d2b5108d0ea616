"""Training metrics as JSON lines, and a guard that notices NaN/Inf without stalling the device.

:class:`MetricsWriter` appends one JSON object per line to ``metrics.jsonl`` and flushes it,
on the main process only (rank 0 under ``--nproc``), and hands every record to the run's
loggers (:mod:`mloc.runtime.files.loggers`: CSV, TensorBoard, W&B). **The schema** (docs/runtime.md):
every record has ``kind``, ``step`` (outer steps done, 1-based) and ``time`` (wall clock,
seconds since the epoch); NaN and Inf are written as ``null``.

======== ========================================================================================
kind     fields besides ``kind``, ``step``, ``time``
======== ========================================================================================
train    ``problem``; ``loss``: the mean of the problem's training losses over the steps since
         the last train record (``loss_steps`` of them; 0: the source reports no loss and
         ``loss`` is the loss on the current batch); ``lr``: its learning rate now (with the
         schedule applied); ``grad_norm`` (a lowest problem) or ``hypergrad_norm`` (an upper
         one): the 2-norm of the gradient its optimizer stepped on at this step (after
         all-reduce, unscaling and clipping); what its optimizer reports about itself
         (``Optimizer.report``: Shampoo's ``roots_rejected``, ``root_failures``); under
         ``--nproc``, ``collectives``: the all-reduces its steps ran per outer step since
         the last train record (:mod:`mloc.runtime.base.overlap`; ``mloc plan`` says how
         many synchronised backwards to expect, one collective per bucket each)
speed    ``problem: "*"``, ``steps_per_s``: outer steps per second since the run (re)started;
         on a CUDA device, ``peak_mib``: the allocator's peak so far (this process's GPU)
eval     ``problem: "*"``, ``eval``: the metric's name, ``value``: its value
summary  ``problem: "*"``, ``steps_per_s``, ``seconds``, ``final``: {metric: value} (each
         problem's last ``loss`` as ``PROBLEM/loss``, the last evaluations): one per start of
         a run, at its last step
======== ========================================================================================

The loss means cost no host sync per step: the losses are the values the run's
:class:`~mloc.runtime.grad.finite.FiniteGuard` keeps on the device anyway, summed when the guard
reads them at a log boundary (``FiniteGuard.means``); the gradient norms are queued only on
the step that ends a log interval (``GradNorms``) and read with the means.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import Tensor


from mloc.runtime.files.runread import KINDS  # noqa: E402  (the kinds a reader accepts: one list)


class MetricsWriter:
    """Appends JSON lines to ``path`` (created with its directory) and passes each record to
    ``loggers`` (objects with ``log(record)`` and ``close()``); with ``enabled=False``
    (every rank but the main one) it opens nothing and writes nothing. ``clock`` gives the
    records' wall ``time``."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True, loggers: Sequence[Any] = (),
                 clock: Callable[[], float] = time.time):
        self.path, self.enabled, self._file = Path(path), enabled, None
        self.loggers, self._clock = tuple(loggers) if enabled else (), clock
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            from mloc.runtime.files.runfiles import own_file
            own_file(self.path)                    # a symlink is replaced, its target untouched
            self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, problem: str, kind: str = "train", **values: Any) -> dict | None:
        """One record ``{"kind": kind, "step": step, "time": now, "problem": problem,
        **values}``, flushed, then given to the loggers; returns it (None when disabled).
        Tensors are read (one sync each: call this at log boundaries only); NaN and Inf
        become ``null``, also inside dicts and lists (the summary's ``final``)."""
        if self._file is None:
            return None
        if kind not in KINDS:
            raise ValueError(f"unknown metrics record kind {kind!r}")
        record = {"kind": kind, "step": int(step), "time": round(self._clock(), 3), "problem": problem,
                  **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        for logger in self.loggers:
            logger.log(record)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for logger in self.loggers:
            logger.close()
        self.loggers = ()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """``value`` as strict JSON can hold it, at any depth: tensors read, NaN and Inf as None."""
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
