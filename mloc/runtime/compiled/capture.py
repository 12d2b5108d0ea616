r"""Capture one training step's tensor work as a single FX graph of ATen operations.

A gradient source (:mod:`mloc.runtime.grad.sources`) is ordinary eager code: the user's
loss, ``torch.autograd.grad`` (with ``create_graph`` for a Hessian-vector product), a
hypergradient method's loop. ``make_fx`` runs it once in *real* tracing mode and records
every operation that reaches the dispatcher, the backward passes included: autograd runs
above the tracer, so a double backward is recorded as the ATen operations it executes
(the same mechanism ``torch.func`` transforms and AOTAutograd rest on; Pearlmutter's
``Hv`` becomes a few more matrix products in the graph). The graph is a pure function of
the tensors passed in, so it can be handed to a compiler and replayed on the next step's
tensors.

The tracer tracks tensors by identity: the step's inputs are the program's own tensors
(parameters, optimizer states, module buffers, the batches), found where the step's
closures find them. Two things need care:

- a *detached alias* made once (a step that binds another module's parameters as
  constants, :meth:`~mloc.runtime.program.binding.BoundLoss.own_with_constants`) is a
  different tensor object over the same memory; the tracer would record it as a constant
  and replay a stale copy. :func:`_rebind_aliases` replaces every such constant by an
  alias of the input it views; a constant that shares memory with an input in any other
  way refuses the capture.
- a value read back to Python (``.item()``, ``float(t)``, ``if t > 0:``) makes the graph
  depend on a number it cannot replay: the tracer refuses it, and so does
  :func:`capture`, with the user's line. The step then runs eagerly, and says why.

Tracing executes the step; its effects on the inputs (a BatchNorm's running statistics)
and on the random number generators are undone (:func:`_preserved`) so that the compiled
replay that follows is the step's one execution.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, fx


class CaptureRefused(Exception):
    """The step cannot be captured as one graph; ``str()`` says why and where."""


@dataclass(frozen=True)
class Captured:
    """A captured step: ``graph(*inputs)`` returns the flat tensors of the step's result,
    which ``rebuild`` turns back into the source's ``(grads, loss)``."""

    graph: fx.GraphModule
    rebuild: Callable[[Sequence[Tensor]], Any]
    operations: int


def capture(step: Callable[[], Any], inputs: Sequence[Tensor], flatten: Callable[[Any], tuple],
            rebuild_like: Callable[[Any], Callable[[Sequence[Tensor]], Any]]) -> Captured:
    """Trace ``step()`` (which reads ``inputs`` through its closures) into a graph of
    ``inputs``. ``flatten(result)`` gives the result's tensors; ``rebuild_like(result)``
    a function that rebuilds a result of the same structure from such tensors. Raises
    :class:`CaptureRefused`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    shape: list = []

    def traced(*_inputs: Tensor):
        result = step()
        shape.append(rebuild_like(result))
        return flatten(result)

    with _preserved(inputs):
        try:
            graph = make_fx(traced, tracing_mode="real")(*inputs)
        except Exception as e:      # noqa: BLE001: any failure of the trace is a refusal
            raise CaptureRefused(_why(e)) from e
    _rebind_aliases(graph, inputs)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    count = sum(1 for n in graph.graph.nodes if n.op == "call_function")
    return Captured(graph, shape[0], count)


@contextmanager
def _preserved(inputs: Sequence[Tensor]) -> Iterator[None]:
    """Run a trace without leaving a trace: the random generators' states and every input
    (module buffers a step writes in place; the parameters and optimizer state a fused step
    updates, :mod:`~mloc.runtime.compiled.fused`) are put back afterwards, and ``.grad``
    fields set during it are cleared."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    kept = [(t, t.detach().clone()) for t in inputs]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, saved in kept:
                t.copy_(saved)
        for t in inputs:
            if t.requires_grad:
                t.grad = None
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _rebind_aliases(graph: fx.GraphModule, inputs: Sequence[Tensor]) -> None:
    """Every recorded constant that is a view of an input becomes ``aten.alias`` of that
    input's placeholder (see the module docstring); one sharing an input's memory in
    another way refuses the capture."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    storages = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    for node in list(graph.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(graph, node.target, None)
        if not isinstance(value, Tensor):
            continue
        hit = next((i for i, t in enumerate(inputs) if _same_memory(value, t)), None)
        if hit is None:
            if value.numel() and value.untyped_storage().data_ptr() in storages:
                raise CaptureRefused("the step reads part of a parameter or buffer through a view made "
                                     "before the step; the compiled step could not follow its updates")
            continue
        with graph.graph.inserting_after(placeholders[hit]):
            alias = graph.graph.call_function(torch.ops.aten.alias.default, (placeholders[hit],))
        node.replace_all_uses_with(alias)
        graph.graph.erase_node(node)
        delattr(graph, node.target)
    graph.graph.lint()


def _why(e: BaseException) -> str:
    """The trace's failure, in a line, with the innermost frame outside torch and mloc's
    runtime (the user's line that did it, where there is one)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if "_local_scalar_dense" in first or "data-dependent" in first.lower():
        first = ("a tensor's value is read back to Python (.item(), float(), bool() or an `if` on a "
                 "tensor), so the step's graph would depend on it")
    where = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        f = frame.filename.replace("\\", "/")
        if "/torch/" not in f and "/mloc/runtime/" not in f and not f.startswith("<"):
            where = f" (at {frame.filename}:{frame.lineno})"
            break
    return first + where
