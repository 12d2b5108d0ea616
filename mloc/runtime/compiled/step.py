"""A gradient source run as a compiled graph: capture once per input signature, replay.

:class:`CompiledSource` has the shape of every source (``source(seed) -> (grads,
loss)``, :mod:`mloc.runtime.grad.sources`) and wraps one: at its first call with inputs
of a new *signature* (the shapes, dtypes and devices of the tensors the step reads, the
modules' train/eval modes, and the plain numbers the step may read: an optimizer's step
count where a hypergradient unrolls or preconditions by the lower's optimizer) it
captures the source (:func:`~mloc.runtime.compiled.capture.capture`) and compiles the
graph (:mod:`~mloc.runtime.compiled.backend`); later calls with that signature replay the
compiled graph on the current tensors. A last, smaller batch is a second signature: one
more compile, then both are replayed.

It falls back to the eager source, for good and with a reason a user can act on, when
the step cannot be captured (a value read back to Python), when the compiler fails, when
loss scaling seeds the loss (the scale is the scaler's business, step by step), or when
the signature keeps changing (more than :data:`MAX_SIGNATURES`: e.g. a number the step
reads changes every step); never silently: the reason is in the run's banner and
``config.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from torch import Tensor

from mloc.runtime.base import tree
from mloc.runtime.compiled.backend import Counts, compile_graph
from mloc.runtime.compiled.capture import CaptureRefused, capture

MAX_SIGNATURES = 4
"""Distinct signatures one step may compile before it runs eagerly (each costs a compile)."""


@dataclass
class StepReport:
    """How one step of one problem ran: ``compiled``, or eagerly with ``reason``."""

    kind: str
    name: str
    reason: str | None = None
    counts: Counts = field(default_factory=Counts)

    @property
    def compiled(self) -> bool:
        return self.reason is None and self.counts.graphs > 0

    @property
    def recompiles(self) -> int:
        """Compiles beyond the first (a new signature, or the compiler's guards failing)."""
        return max(self.counts.compiles - 1, 0)

    def line(self) -> str:
        what = f"{self.kind} step of {self.name}"
        if self.reason is not None:
            return f"{what}: eager ({self.reason})"
        if not self.counts.graphs:
            return f"{what}: not yet run"
        return (f"{what}: compiled ({self.counts.operations} operations, {self.counts.graphs} "
                f"graph{'s' if self.counts.graphs != 1 else ''}, {self.counts.seconds:.1f} s to compile)")


def _flatten(result) -> tuple[Tensor, ...]:
    grads, loss = result
    return (*grads, loss) if loss is not None else tuple(grads)


def _rebuild_like(result) -> Callable[[Sequence[Tensor]], Any]:
    grads, loss = result
    n, missing, has_loss = len(grads), tree.absent(grads), loss is not None

    def rebuild(flat: Sequence[Tensor]):
        return tree.marked(flat[:n], missing), (flat[n] if has_loss else None)
    return rebuild


class CompiledSource:
    """``source`` compiled (see the module docstring). ``inputs()`` lists the tensors the
    step reads, ``numbers()`` the plain values it may read; ``report`` records what
    happened."""

    def __init__(self, source: Callable, inputs: Callable[[], list[Tensor]],
                 numbers: Callable[[], tuple], report: StepReport):
        self.source, self.inputs, self.numbers, self.report = source, inputs, numbers, report
        self.cache: dict[tuple, tuple[Callable, Callable]] = {}

    def __call__(self, seed=None):
        if self.report.reason is not None:
            return self.source(seed)
        if seed is not None:
            return self._eager("loss scaling seeds the loss with the scaler's current scale", seed)
        inputs = self.inputs()
        key = (tuple((t.shape, t.dtype, t.device, t.requires_grad) for t in inputs), self.numbers())
        entry = self.cache.get(key)
        if entry is None:
            if len(self.cache) >= MAX_SIGNATURES:
                return self._eager(f"its inputs changed {MAX_SIGNATURES + 1} times (shapes, modes or a "
                                   "number it reads, such as an optimizer's step count)", seed)
            entry = self._build(inputs)
            if entry is None:
                return self.source(seed)
            self.cache[key] = entry
            run, rebuild = entry
            counts = self.report.counts
            start = time.perf_counter()
            try:
                out = run(*inputs)
            except Exception as e:      # noqa: BLE001: the compiler's failure is a fallback
                self.cache.pop(key)
                return self._eager(f"the compiler failed: {_first_line(e)}", seed)
            counts.seconds += time.perf_counter() - start
            return rebuild(out)
        run, rebuild = entry
        return rebuild(run(*inputs))

    def _build(self, inputs: list[Tensor]):
        try:
            captured = capture(lambda: self.source(None), inputs, _flatten, _rebuild_like)
        except CaptureRefused as e:
            self.report.reason = str(e)
            return None
        self.report.counts.graphs += 1
        self.report.counts.operations = captured.operations
        return compile_graph(captured.graph, self.report.counts), captured.rebuild

    def _eager(self, reason: str, seed):
        self.report.reason = reason
        self.cache.clear()
        return self.source(seed)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
