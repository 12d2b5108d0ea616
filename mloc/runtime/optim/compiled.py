r"""Optimizer commits compiled with ``torch.compile`` (Inductor), and what they report.

:meth:`Optimizer.compiled_commit <mloc.runtime.optim.base.Optimizer.compiled_commit>` returns
a :class:`CompiledCommit`: a callable with :meth:`~mloc.runtime.optim.base.Optimizer.commit`'s
signature and meaning (``fn(grads, state, params) -> state``, in place, called under
``torch.no_grad``) whose tensor work runs in one or more :class:`Region`\ s, each a function
compiled with ``torch.compile(fullgraph=True)``, so that the elementwise formulas of a step
fuse into a few kernels. The state it returns has the eager commit's layout (the same
NamedTuple, the same tensors' shapes and dtypes; a Python int step count): a checkpoint
written by one is read by the other, and a run may switch between them at any step.

What the engine reads from it:

- ``reason``: None while the commit is compiled; otherwise one line saying why it runs
  eagerly: known when it is built (``refused``: a ``torch.optim`` optimizer) or found at a
  call (the compiler's own exception, e.g. a graph break at an unsupported operation under
  ``fullgraph``, or the recompile limit reached): that call and every later one then run
  the eager commit, which gives the same results.
- ``compiles``: graphs compiled so far (Dynamo's ``unique_graphs`` counter, read around each
  call of a region: a restarted analysis is one graph); ``recompiles``: those beyond each
  region's first. In steady state neither grows: a scheduled hyperparameter is a 0-dim
  tensor (an input, rewritten in place), every tensor of the state is an input, never a
  constant (Shampoo's roots, replaced at every install), and a step count that reaches a
  region (the default, the whole ``commit``) is a Python int, a constant on the first step
  and symbolic from the second compile on (SGD: two graphs, the first step's and the
  others'). Numbers derived from the count every step (Adam's bias corrections) are
  computed on the host and given to the region as a float64 tensor (:func:`host_numbers`):
  as symbols, a power of the count would be evaluated in every vector of the fused loop
  (Inductor does not hoist it; Adam's compiled step was 2 × its eager one), and a Python
  float given to a kernel as its scalar is a constant, recompiled when it changes.
- ``compile_seconds``: wall time of the calls that compiled (the compile and that step).

Each region compiles a fresh copy of its function's code object, named after the
optimizer and a serial number: Dynamo keeps its cache and its recompile limit per code
object, and its automatic-dynamic memory per (file, line, name), so two optimizers (two
problems) never share, evict or re-specialise each other's graphs.
"""

from __future__ import annotations

import itertools
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._dynamo.exc import TorchDynamoException as _DYNAMO_ERRORS

_serial = itertools.count()


def _fresh(fn: Callable, name: str) -> Callable:
    """``fn`` (a plain function or a bound method) on a copy of its code object called
    ``name``: its own Dynamo cache, recompile limit and automatic-dynamic memory."""
    bound = getattr(fn, "__self__", None)
    f = getattr(fn, "__func__", fn)
    code = f.__code__.replace(co_name=name, co_qualname=name)
    copy = types.FunctionType(code, f.__globals__, name, f.__defaults__, f.__closure__)
    copy.__kwdefaults__ = f.__kwdefaults__
    return types.MethodType(copy, bound) if bound is not None else copy




def _explain(e: BaseException) -> str:
    """The compiler's exception in one line: its type and the first line of its message."""
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


class Region:
    """One function run under ``torch.compile(fullgraph=True)`` (Inductor), counting the
    graphs it compiles; called while Dynamo traces a caller, the function itself (it is
    inlined into the caller's graph). The first call that the compiler cannot take (a graph break, a
    backend failure: any ``torch._dynamo`` exception), or any call once Dynamo's recompile
    limit of graphs is reached (past it Dynamo would run the function uncompiled, silently),
    turns the region eager for good, with ``reason`` saying why; the function is then
    called as it is, from that call on (Dynamo traces on fake tensors, so a failed compile
    has changed nothing)."""

    def __init__(self, fn: Callable, name: str):
        from torch._dynamo.config import recompile_limit
        from torch._dynamo.utils import counters
        self.fn, self.name = fn, f"{name}_{next(_serial)}"
        self.compiled = torch.compile(_fresh(fn, self.name), fullgraph=True, backend="inductor")
        self.reason: str | None = None
        self.compiles, self.seconds = 0, 0.0
        self._stats, self._limit = counters["stats"], recompile_limit

    def __call__(self, *args):
        if self.reason is not None or torch.compiler.is_compiling():    # eager, or traced into a caller's graph
            return self.fn(*args)
        if self.compiles >= self._limit:            # a guard that fails every few steps
            self.reason = (f"{self.compiles} graphs compiled, Dynamo's recompile_limit: a guard fails "
                           "again and again (TORCH_LOGS=recompiles says which)")
            return self.fn(*args)
        before, start = self._stats["unique_graphs"], time.perf_counter()
        try:
            out = self.compiled(*args)
        except _DYNAMO_ERRORS as e:
            self.reason = _explain(e)
            return self.fn(*args)
        new = self._stats["unique_graphs"] - before
        if new:
            self.compiles += new
            self.seconds += time.perf_counter() - start
        return out


@dataclass(frozen=True)
class CompiledCommit:
    """A commit whose tensor work runs in compiled :class:`Region`\\ s (see the module
    docstring): call it as :meth:`Optimizer.commit`. ``refused``: why nothing is compiled
    (then ``fn`` is the eager commit and ``regions`` is empty)."""

    fn: Callable[[Any, Any, Any], Any]
    regions: tuple[Region, ...] = ()
    refused: str | None = None

    def __call__(self, grads, state, params):
        return self.fn(grads, state, params)

    @property
    def reason(self) -> str | None:
        """None while compiled; else why (some of) the step runs eagerly."""
        if self.refused is not None:
            return self.refused
        return next((f"{r.name}: {r.reason}" for r in self.regions if r.reason is not None), None)

    @property
    def compiled(self) -> bool:
        return self.reason is None

    @property
    def compiles(self) -> int:
        return sum(r.compiles for r in self.regions)

    @property
    def recompiles(self) -> int:
        return sum(max(0, r.compiles - 1) for r in self.regions)

    @property
    def compile_seconds(self) -> float:
        return sum(r.seconds for r in self.regions)


def host_numbers(values, params) -> torch.Tensor:
    """``values`` (numbers computed on the host each step, or 0-dim tensors where a
    schedule made them so) as one float64 tensor on the parameters' device: how numbers that
    change every step enter a region (a Python float given to a kernel as its scalar is a
    constant to the compiler, recompiled when it changes)."""
    device = params[0].device if len(params) else None
    if any(isinstance(v, torch.Tensor) for v in values):
        return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).detach() for v in values])
    return torch.tensor(values, dtype=torch.float64, device=device)


def compile_commit(optimizer) -> CompiledCommit:
    """The default hook: ``optimizer.commit`` itself in one region (the step's whole
    tensor work, its interpreter as eager: :data:`~.ops.INPLACE` with number
    hyperparameters, :data:`~.ops.FUNCTIONAL` and ``params += updates`` with a tensor one)."""
    region = Region(optimizer.commit, f"{type(optimizer).__name__}_commit")
    return CompiledCommit(region, (region,))


def eager_commit(optimizer, reason: str) -> CompiledCommit:
    """The eager commit, refusing compilation for ``reason``."""
    return CompiledCommit(optimizer.commit, (), reason)
