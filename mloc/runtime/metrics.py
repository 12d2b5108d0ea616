"""Training metrics as JSON lines, and a guard that notices NaN/Inf without stalling the device.

:class:`MetricsWriter` appends one JSON object per line (``{"step": 100, "problem":
"classifier", "loss": 0.41, ...}``) and flushes it, on the main process only.

:class:`FiniteGuard` watches losses and gradients. :meth:`FiniteGuard.watch` only queues
device work (one value per watch, the loss or the largest absolute gradient entry, copied
into a preallocated buffer that stays on the device): it never calls ``.item()``, so the
training loop does not synchronise with the device every step. :meth:`FiniteGuard.check`,
called at log and checkpoint boundaries, reads the buffer with one transfer, finds the
first non-finite value and raises :class:`NonFiniteError` naming the step and problem (in
watch order) it came from.
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
    """Records, on the device, one value per watch; :meth:`check` finds the first
    ``(step, problem, what)`` whose tensors were not finite and raises it (see the module
    docstring)."""

    CAPACITY = 4096     # watches recorded between two checks before a fold (see _fold)

    def __init__(self, capacity: int | None = None):
        self._capacity = capacity or self.CAPACITY
        self._keys: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._buf: Tensor | None = None         # one value per watch, in watch order
        self._rows: list[Tensor] = []           # 0-dim views of _buf, made once
        self._records: list[tuple[int | Tensor, int]] = []   # (step, code) of each row
        self._first: tuple[int, int] | None = None  # found by a fold, not yet raised

    def watch(self, step: int | Tensor, problem: str, tensors: Tensor | Sequence[Tensor | None],
              what: str = "loss") -> None:
        """Note whether ``tensors`` (a loss, or a problem's gradients; ``None`` entries are
        skipped) are all finite at ``step`` (an int, or a 0-dim integer tensor on the device
        or the CPU). Queues device work only: no ``.item()``, no host sync.

        One value per call is written into a preallocated device buffer: a 0-dim loss
        itself (one copy), else the largest absolute value of the tensors (one
        ``_foreach_norm(ord=inf)``, a ``stack``, an ``amax`` and the copy; NaN propagates
        through all of them and a maximum of finite numbers cannot overflow). The value is
        finite exactly when every entry of every tensor is."""
        if isinstance(tensors, Tensor):
            value = tensors
            if value.dim():
                if not _inexact(value):
                    return
                value = torch.linalg.vector_norm(value, math.inf)
        else:
            try:        # the common case (a problem's gradients), with no Python per tensor
                value = torch.stack(torch._foreach_norm(tensors, math.inf)).amax()
            except (TypeError, RuntimeError):   # None entries, integer tensors, an empty list
                ts = [t for t in tensors if t is not None and _inexact(t)]
                if not ts:
                    return
                value = torch.stack([torch.linalg.vector_norm(t, math.inf) for t in ts]).amax()
        if value.requires_grad:
            value = value.detach()
        n = len(self._records)
        if n == len(self._rows):
            if self._buf is None:
                # float64 holds any finite float16/bfloat16/float32/float64 value (MPS has
                # no float64, and no float64 losses either)
                dtype = torch.float32 if value.device.type == "mps" else torch.float64
                self._buf = torch.zeros(self._capacity, dtype=dtype, device=value.device)
                self._rows = list(self._buf.unbind())
            else:
                self._fold()
                n = 0
        code = self._keys.get((problem, what))
        if code is None:
            code = self._keys[(problem, what)] = len(self._names)
            self._names.append((problem, what))
        if isinstance(step, Tensor):
            step = step.detach().clone()        # its value now, as the device sees it
        self._rows[n].copy_(value)
        self._records.append((step, code))

    def _scan(self) -> tuple[int, int] | None:
        """The first recorded ``(step, code)`` whose value is not finite (one transfer), and
        forget the records."""
        n = len(self._records)
        if not n:
            return None
        values = self._buf[:n].tolist()
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        found = None
        if bad is not None:
            step, code = self._records[bad]
            found = (int(step), code)
        self._records = []
        return found

    def _fold(self) -> None:
        """The buffer is full (``capacity`` watches without a check): read it now, keep the
        first failure on the host and start over. One host sync per ``capacity`` watches;
        a training loop that checks at its log interval never gets here."""
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
