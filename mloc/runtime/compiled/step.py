"""A gradient source run as a compiled graph: capture once per input signature, replay.

:class:`CompiledSource` has the shape of every source (``source(seed) -> (grads,
loss)``, :mod:`mloc.runtime.grad.sources`) and wraps one: at its first call with inputs
of a new *signature* (the shapes, strides, dtypes and devices of the tensors the step reads, the
modules' train/eval modes, and the plain numbers the step may read: an optimizer's step
count where a hypergradient unrolls or preconditions by the lower's optimizer) it
captures the source (:func:`~mloc.runtime.compiled.capture.capture`) and compiles the
graph (:mod:`~mloc.runtime.compiled.backend`); later calls with that signature replay the
compiled graph on the current tensors. A last, smaller batch is a second signature: one
more compile, then both are replayed.

An upper step whose hypergradient reads a lower's optimizer state (an unroll, SAMA's
diagonal) reads its step count, a Python number that changes every step: during the
capture the state's numbers are *lifted* into 0-dim float64 tensors (:func:`_lifted`),
so the graph takes them as inputs and one graph serves every step (``β₁ᵗ`` is then
computed by ``torch.pow`` in float64, as Python computes it). A comparison of such a
number (``if count == 0:``, SGD's first momentum step) is answered from its value and
kept as a *guard* (:class:`_Number`), as TorchDynamo guards: the graph is replayed only
while every guard gives the same answer, and a step where one does not is captured
again (SGD's second step: one more graph, then none).

It falls back to the eager source, for good and with a reason a user can act on, when
the step cannot be captured (a value read back to Python), when the compiler fails, when
loss scaling seeds the loss (the scale is the scaler's business, step by step), or when
the signature keeps changing (more than :data:`MAX_SIGNATURES`: e.g. a number the step
reads changes every step); never silently: the reason is in the run's banner and
``config.json``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
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
    fused: bool = False         # the optimizer's update is in the step's graph (compiled.fused)
    split: str | None = None    # else why it is compiled apart (None: the step commits nothing)
    apart: str | None = None    # fused, but which steps committed apart (Optimizer.apart)

    @property
    def compiled(self) -> bool:
        return self.reason is None and self.counts.graphs > 0

    @property
    def recompiles(self) -> int:
        """Compiles beyond the first (a new signature, or the compiler's guards failing)."""
        return max(self.counts.compiles - 1, 0)

    @property
    def graphs(self) -> int:
        return self.counts.graphs

    @property
    def operations(self) -> int:
        return self.counts.operations

    @property
    def seconds(self) -> float:
        return self.counts.seconds

    def line(self) -> str:
        what = f"{self.kind} step of {self.name}"
        if self.reason is not None:
            return f"{what}: eager ({self.reason})"
        if not self.counts.graphs:
            return f"{what}: not yet run"
        update = (f"; the optimizer update in the graph{f' ({self.apart})' if self.apart else ''}" if self.fused else
                  f"; the optimizer update compiled apart: {self.split}" if self.split else "")
        return (f"{what}: compiled ({self.counts.operations} operations, {self.counts.graphs} "
                f"graph{'s' if self.counts.graphs != 1 else ''}, {self.counts.seconds:.1f} s to compile{update})")


class CommitReport:
    """How one problem's optimizer commit ran (its
    :class:`~mloc.runtime.optim.compiled.CompiledCommit`), read as a :class:`StepReport`."""

    kind = "commit"

    def __init__(self, name: str, commit: Any):
        self.name, self.commit = name, commit

    @property
    def reason(self) -> str | None:
        return self.commit.reason

    @property
    def compiled(self) -> bool:
        return self.commit.reason is None and self.commit.compiles > 0

    @property
    def recompiles(self) -> int:
        return self.commit.recompiles

    @property
    def graphs(self) -> int:
        return self.commit.compiles

    @property
    def seconds(self) -> float:
        return self.commit.compile_seconds

    operations = None

    def line(self) -> str:
        what = f"optimizer commit of {self.name}"
        if self.reason is not None:
            return f"{what}: eager ({self.reason})"
        if not self.graphs:
            return f"{what}: not yet run"
        return f"{what}: compiled ({self.graphs} graph{'s' if self.graphs != 1 else ''}, {self.seconds:.1f} s)"


def _flatten(result) -> tuple[Tensor, ...]:
    """A source's ``(grads, loss)`` as the graph's outputs."""
    grads, loss = result
    return (*grads, loss) if loss is not None else tuple(grads)


def _rebuild_like(result) -> Callable[[Sequence[Tensor]], Any]:
    """How to rebuild a ``(grads, loss)`` like ``result`` from the graph's outputs."""
    grads, loss = result
    n, missing, has_loss = len(grads), tree.absent(grads), loss is not None

    def rebuild(flat: Sequence[Tensor]):
        return tree.marked(flat[:n], missing), (flat[n] if has_loss else None)
    return rebuild


def flatten_each(results) -> tuple[Tensor, ...]:
    """A list of ``(grads, loss)`` (an interlocking chain's stages) as the graph's outputs."""
    return tuple(t for r in results for t in _flatten(r))


def rebuild_each(results) -> Callable[[Sequence[Tensor]], Any]:
    """How to rebuild a list of ``(grads, loss)`` like ``results`` from the graph's outputs."""
    parts = [(len(_flatten(r)), _rebuild_like(r)) for r in results]

    def rebuild(flat: Sequence[Tensor]):
        out, at = [], 0
        for n, one in parts:
            out.append(one(flat[at:at + n]))
            at += n
        return out
    return rebuild


class CompiledSource:
    """``source`` compiled (see the module docstring). ``inputs()`` lists the tensors the
    step reads, ``numbers()`` the plain values it may read; ``report`` records what
    happened."""

    def __init__(self, source: Callable, inputs: Callable[[], list[Tensor]],
                 numbers: Callable[[], tuple], report: StepReport, lifted: Sequence[Any] = (),
                 outputs: tuple[Callable, Callable] = (_flatten, _rebuild_like)):
        self.source, self.inputs, self.numbers, self.report = source, inputs, numbers, report
        self.lifted = tuple(lifted)     # the problems whose optimizer state's numbers are inputs
        self.outputs = outputs          # (flatten, rebuild_like) of what the source returns
        self.cache: dict[tuple, tuple[Callable, Callable]] = {}

    def _all_inputs(self) -> tuple[list[Tensor], list]:
        inputs, numbers = self.inputs(), []
        for problem in self.lifted:
            numbers.extend(_numbers_of(problem.state))
        inputs.extend(torch.tensor(float(v), dtype=torch.float64) for v in numbers)
        return inputs, numbers

    def _find(self, key: tuple, numbers: list):
        for guards, entry in self.cache.get(key, ()):
            if all(_compare(derive(numbers[i]), op, other) == answer for i, derive, op, other, answer in guards):
                return entry
        return None

    def __call__(self, seed=None):
        if self.report.reason is not None:
            return self.source(seed)
        if seed is not None:
            return self._eager("loss scaling seeds the loss with the scaler's current scale", seed)
        inputs, numbers = self._all_inputs()
        key = (tuple((t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in inputs), self.numbers())
        entry = self._find(key, numbers)
        if entry is None:
            if sum(map(len, self.cache.values())) >= MAX_SIGNATURES:
                return self._eager(f"its inputs changed {MAX_SIGNATURES + 1} times (shapes, modes or a "
                                   "number it reads, such as an optimizer's step count)", seed)
            built = self._build(inputs, numbers)
            if built is None:
                return self.source(seed)
            guards, entry = built
            self.cache.setdefault(key, []).append((guards, entry))
            run, rebuild = entry
            counts = self.report.counts
            start = time.perf_counter()
            try:
                out = run(*inputs)
            except Exception as e:      # noqa: BLE001: the compiler's failure is a fallback
                return self._eager(f"the compiler failed: {_first_line(e)}", seed)
            counts.seconds += time.perf_counter() - start
            return rebuild(out)
        run, rebuild = entry
        return rebuild(run(*inputs))

    def _build(self, inputs: list[Tensor], numbers: list):
        tensors = inputs[len(inputs) - len(numbers):]
        guards: list = []
        lifted = [_Number(t, v, i, guards) for i, (t, v) in enumerate(zip(tensors, numbers))]
        try:
            with _lifted(self.lifted, lifted):
                captured = capture(lambda: self.source(None), inputs, *self.outputs)
        except CaptureRefused as e:
            self.report.reason = str(e)
            return None
        self.report.counts.graphs += 1
        self.report.counts.operations = captured.operations
        return tuple(guards), (compile_graph(captured.graph, self.report.counts), captured.rebuild)

    def _eager(self, reason: str, seed):
        self.report.reason = reason
        self.cache.clear()
        return self.source(seed)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers_of(state) -> list:
    """The numbers (not booleans) among the leaves of an optimizer state, in order."""
    if _is_number(state):
        return [state]
    if isinstance(state, (tuple, list)):
        return [x for v in state for x in _numbers_of(v)]
    if isinstance(state, dict):
        return [x for v in state.values() for x in _numbers_of(v)]
    return []


def _replace_numbers(state, values):
    if _is_number(state):
        return next(values)
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(_replace_numbers(v, values) for v in state))
    if isinstance(state, (tuple, list)):
        return type(state)(_replace_numbers(v, values) for v in state)
    if isinstance(state, dict):
        return {k: _replace_numbers(v, values) for k, v in state.items()}
    return state


_COMPARISONS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
                "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _compare(value, op: str, other) -> bool:
    return bool(_COMPARISONS[op](value, other))


def _identity(v):
    return v


class _Number:
    """A number of an optimizer state during a capture: arithmetic goes to ``tensor`` (an
    input of the graph, so the graph follows the number), a comparison is answered from
    ``value`` and recorded in ``guards`` as ``(index, derive, op, other, answer)``, where
    ``derive`` computes this number from input ``index``'s value; converting it to a Python
    number (``int()``, an index) specializes the graph on its value (a guard ``== value``).
    Integer arithmetic with a Python int (``count + 1``, an unrolled step's new count) gives
    a ``_Number`` again, so a later step's ``if count == 0`` is a guard too; any other
    arithmetic (``β ** count``) gives the tensor."""

    __slots__ = ("tensor", "value", "index", "guards", "derive")

    def __init__(self, tensor: Tensor, value, index: int, guards: list, derive=_identity):
        self.tensor, self.value, self.index, self.guards, self.derive = tensor, value, index, guards, derive

    def _guard(self, op: str, other) -> bool:
        other = other.value if isinstance(other, _Number) else other
        answer = _compare(self.value, op, other)
        self.guards.append((self.index, self.derive, op, other, answer))
        return answer

    def _plain(self):
        self._guard("==", self.value)
        return self.value

    def __eq__(self, o): return self._guard("==", o)          # noqa: E704
    def __ne__(self, o): return self._guard("!=", o)          # noqa: E704
    def __lt__(self, o): return self._guard("<", o)           # noqa: E704
    def __le__(self, o): return self._guard("<=", o)          # noqa: E704
    def __gt__(self, o): return self._guard(">", o)           # noqa: E704
    def __ge__(self, o): return self._guard(">=", o)          # noqa: E704
    def __bool__(self): return self._guard("!=", 0)           # noqa: E704
    def __int__(self): return int(self._plain())              # noqa: E704
    def __index__(self): return int(self._plain())            # noqa: E704
    def __float__(self): return float(self._plain())          # noqa: E704
    def __hash__(self): return hash(self._plain())            # noqa: E704

    def _int(self, o, fn, tensor_fn):
        """``fn(value, o)`` as a ``_Number`` when both are ints, else the tensor's result."""
        if isinstance(o, int) and not isinstance(o, bool) and isinstance(self.value, int):
            d = self.derive
            return _Number(tensor_fn(self.tensor, o), fn(self.value, o), self.index, self.guards,
                           lambda v: fn(d(v), o))
        return tensor_fn(self.tensor, o.tensor if isinstance(o, _Number) else o)

    def __add__(self, o): return self._int(o, lambda a, b: a + b, lambda a, b: a + b)     # noqa: E704
    def __radd__(self, o): return self._int(o, lambda a, b: b + a, lambda a, b: b + a)    # noqa: E704
    def __sub__(self, o): return self._int(o, lambda a, b: a - b, lambda a, b: a - b)     # noqa: E704
    def __rsub__(self, o): return self._int(o, lambda a, b: b - a, lambda a, b: b - a)    # noqa: E704
    def __mul__(self, o): return self._int(o, lambda a, b: a * b, lambda a, b: a * b)     # noqa: E704
    def __rmul__(self, o): return self._int(o, lambda a, b: b * a, lambda a, b: b * a)    # noqa: E704

    def _t(self, o):
        return o.tensor if isinstance(o, _Number) else o

    def __truediv__(self, o): return self.tensor / self._t(o)     # noqa: E704
    def __rtruediv__(self, o): return self._t(o) / self.tensor    # noqa: E704
    def __pow__(self, o): return self.tensor ** self._t(o)    # noqa: E704
    def __rpow__(self, o): return self._t(o) ** self.tensor   # noqa: E704
    def __neg__(self): return -self.tensor                    # noqa: E704


@contextmanager
def _lifted(problems: Sequence[Any], tensors: Sequence[Any]) -> Iterator[None]:
    """The problems' optimizer states with their numbers replaced by ``tensors`` (in
    order: :class:`_Number`), for the duration of a capture."""
    saved = [p.state for p in problems]
    it = iter(tensors)
    try:
        for p in problems:
            p.state = _replace_numbers(p.state, it)
        yield
    finally:
        for p, state in zip(problems, saved):
            p.state = state


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
