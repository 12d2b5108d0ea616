"""Training metrics as JSON lines, and a guard that notices NaN/Inf without stalling the device.

:class:`MetricsWriter` appends one JSON object per line (``{"step": 100, "problem":
"classifier", "loss": 0.41, ...}``) and flushes it, on the main process only.

:class:`FiniteGuard` watches losses and gradients. :meth:`FiniteGuard.watch` only queues
device work (it keeps 0-dim values on the device: the loss itself, or each gradient
tensor's largest absolute entry from one fused kernel): it never calls ``.item()``, so the training loop does not
synchronise with the device every step. :meth:`FiniteGuard.check`, called at log and
checkpoint boundaries, reads the kept values with one transfer, finds the first non-finite
one and raises :class:`NonFiniteError` naming the step and problem (in watch order) it
came from.
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


def _inexact(t: Tensor) -> bool:
    """Floating or complex: integer and bool tensors are always finite."""
    return t.is_floating_point() or t.is_complex()


class NonFiniteError(Exception):
    """The ``what`` (loss, gradient, ...) of ``problem`` was NaN or Inf at ``step``."""

    def __init__(self, problem: str, step: int, what: str):
        super().__init__(f"the {what} of problem `{problem}` became NaN or Inf at step {step}")
        self.problem, self.step, self.what = problem, step, what
        self.help = ("lower the learning rate, check the data and the loss for divisions by zero or "
                     "logs of zero, or use fp32/bf16 instead of fp16; resume from the last checkpoint")


class FiniteGuard:
    """Keeps, on the device, one 0-dim value per watched tensor; :meth:`check` finds the
    first ``(step, problem, what)`` whose tensors were not finite and raises it (see the
    module docstring)."""

    CAPACITY = 4096     # values kept between two checks before a fold (see _fold)

    def __init__(self, capacity: int | None = None):
        self._capacity = capacity or self.CAPACITY
        self._keys: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._values: list[Tensor] = []          # one 0-dim device tensor per watch, in order
        self._records: list[tuple[int | Tensor, int]] = []   # (step, code) of each value
        self._first: tuple[int, int] | None = None  # found by a fold, not yet raised

    def watch(self, step: int | Tensor, problem: str, tensors: Tensor | Sequence[Tensor | None],
              what: str = "loss") -> None:
        """Note whether ``tensors`` (a loss, or a problem's gradients; ``None`` entries are
        skipped) are all finite at ``step`` (an int, or a 0-dim integer tensor on the device
        or the CPU). Queues device work only: no ``.item()``, no host sync.

        0-dim values are kept on the device: a 0-dim loss itself (no kernel), else the
        largest absolute value of each tensor (one fused ``_foreach_norm(ord=inf)`` for a
        problem's gradients, kept as they come; NaN propagates through it and a maximum of
        finite numbers cannot overflow). A value is finite exactly when every entry of its
        tensor is. A 0-dim tensor that was never modified and is no view is kept as it is
        (it must not be modified in place afterwards; the engine's detached losses never
        are); any other is copied."""
        if isinstance(tensors, Tensor):
            value = tensors
            if value.dim():
                if not _inexact(value):
                    return
                value = torch.linalg.vector_norm(value, math.inf)
            elif value._version or value._base is not None:
                value = value.clone()        # a tensor that may change later: its value now
        else:
            try:        # the common case (a problem's gradients): one fused kernel, kept as is
                norms = torch._foreach_norm(tensors, math.inf)
            except (TypeError, RuntimeError):   # None entries, integer tensors, an empty list
                norms = None
            if norms is None:
                ts = [t for t in tensors if t is not None and _inexact(t)]
                if not ts:
                    return
                norms = [torch.linalg.vector_norm(t, math.inf) for t in ts]
            self._keep(step, problem, what, norms)
            return
        self._keep(step, problem, what, (value.detach() if value.requires_grad else value,))

    def _keep(self, step, problem: str, what: str, values: Sequence[Tensor]) -> None:
        if len(self._values) + len(values) > self._capacity:
            self._fold()
        code = self._keys.get((problem, what))
        if code is None:
            code = self._keys[(problem, what)] = len(self._names)
            self._names.append((problem, what))
        if isinstance(step, Tensor):
            step = step.detach().clone()        # its value now, as the device sees it
        self._values.extend(values)
        self._records.extend([(step, code)] * len(values))

    def _scan(self) -> tuple[int, int] | None:
        """The first kept ``(step, code)`` whose value is not finite (one transfer), and
        forget what was kept."""
        values, records = self._values, self._records
        self._values, self._records = [], []
        if not values:
            return None
        try:
            read = torch.stack(values).tolist()        # promotes to the widest dtype
        except RuntimeError:                            # values on several devices
            read = [v.item() for v in values]
        bad = next((i for i, v in enumerate(read) if not math.isfinite(v)), None)
        if bad is None:
            return None
        step, code = records[bad]
        return int(step), code

    def _fold(self) -> None:
        """``capacity`` values without a check: read them now, keep the first failure on
        the host and start over. One host sync per ``capacity`` values; a training loop
        that checks at its log interval never gets here."""
        found = self._scan()
        if self._first is None:
            self._first = found

    def check(self) -> None:
        """Raise :class:`NonFiniteError` for the first non-finite watch, if any (one sync)."""
        if self._first is None:
            self._first = self._scan()
        if self._first is not None:
            step, code = self._first
            problem, what = self._names[code]
            raise NonFiniteError(problem, step, what)
