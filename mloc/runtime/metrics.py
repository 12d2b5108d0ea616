"""Training metrics as JSON lines, and a guard that notices NaN/Inf without stalling the device.

:class:`MetricsWriter` appends one JSON object per line (``{"step": 100, "problem":
"classifier", "loss": 0.41, ...}``) and flushes it, on the main process only.

:class:`FiniteGuard` watches losses and gradients. :meth:`FiniteGuard.watch` only queues
device work (an ``isfinite`` reduction and two ``where``\\ s into a small record that stays
on the device): it never calls ``.item()``, so the training loop does not synchronise with
the device every step. :meth:`FiniteGuard.check`, called at log and checkpoint boundaries,
reads the record with one transfer and raises :class:`NonFiniteError` naming the first
step and problem (in watch order) whose tensor was not finite.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor


class MetricsWriter:
    """Appends JSON lines to ``path`` (created with its directory); with ``enabled=False``
    (every rank but the main one) it opens nothing and writes nothing."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True):
        self.path, self.enabled, self._file = Path(path), enabled, None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, problem: str, **values: Any) -> None:
        """One line ``{"step": step, "problem": problem, **values}``, flushed. Tensors are read
        (one sync each: call this at log boundaries only); NaN and Inf become ``null``."""
        if self._file is None:
            return
        record = {"step": int(step), "problem": problem, **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain(value: Any) -> Any:
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class NonFiniteError(Exception):
    """The ``what`` (loss, gradient, ...) of ``problem`` was NaN or Inf at ``step``."""

    def __init__(self, problem: str, step: int, what: str):
        super().__init__(f"the {what} of problem `{problem}` became NaN or Inf at step {step}")
        self.problem, self.step, self.what = problem, step, what
        self.help = ("lower the learning rate, check the data and the loss for divisions by zero or "
                     "logs of zero, or use fp32/bf16 instead of fp16; resume from the last checkpoint")


class FiniteGuard:
    """Records, on the device, the first ``(step, problem, what)`` whose tensors were not
    finite; :meth:`check` raises it (see the module docstring)."""

    def __init__(self):
        self._keys: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._step: Tensor | None = None      # -1 while everything was finite
        self._code: Tensor | None = None      # index into _names

    def watch(self, step: int | Tensor, problem: str, tensors: Tensor | Sequence[Tensor | None],
              what: str = "loss") -> None:
        """Note whether ``tensors`` (a loss, or a problem's gradients; ``None`` entries are
        skipped) are all finite at ``step`` (an int, or a 0-dim integer tensor on the device
        or the CPU). Queues device work only: no ``.item()``, no host sync."""
        ts = [tensors] if isinstance(tensors, Tensor) else [t for t in tensors if t is not None]
        if not ts:
            return
        finite = [torch.isfinite(t).all() for t in ts]
        ok = finite[0] if len(finite) == 1 else torch.stack(finite).all()
        if self._step is None:
            self._step = torch.full((), -1, dtype=torch.int64, device=ok.device)
            self._code = torch.full((), -1, dtype=torch.int64, device=ok.device)
        code = self._keys.get((problem, what))
        if code is None:
            code = self._keys[(problem, what)] = len(self._names)
            self._names.append((problem, what))
        first = torch.logical_and(~ok, self._step < 0)
        self._step = torch.where(first, step, self._step)
        self._code = torch.where(first, code, self._code)

    def check(self) -> None:
        """Raise :class:`NonFiniteError` for the first non-finite watch, if any (one sync)."""
        if self._step is None:
            return
        step, code = torch.stack([self._step, self._code]).tolist()
        if step >= 0:
            problem, what = self._names[code]
            raise NonFiniteError(problem, step, what)
