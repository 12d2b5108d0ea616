"""Hand a captured step's graph to the compiler: TorchInductor, called directly.

The captured graph is already what TorchDynamo would produce (an FX graph of ATen
operations, no Python left in it), and :class:`~mloc.runtime.compiled.step.CompiledSource`
keeps its own guards (the inputs' shapes, strides, dtypes, devices, the modules' modes,
the lifted numbers' comparisons), so the graph goes to Inductor's ``compile_fx`` without
Dynamo in front: no second trace, and no per-call guard evaluation (Dynamo's frame and
guards cost ~20 µs a call, measured on a 3-operation graph). ``compile_fx``
functionalizes the graph's in-place updates of inputs (a buffer's running statistics
become outputs copied back, AOTAutograd) and generates fused kernels (C++/OpenMP on the
CPU, Triton on CUDA). The graph has no autograd left in it (the backward passes were
recorded as operations), so it is compiled and called without autograd.

Random numbers: ``fallback_random`` (:data:`CONFIG`) makes the compiled graph draw from torch's own
generators with eager's kernels, so a compiled step draws the numbers its eager form
draws (a dropout mask) and a resumed run continues the stream exactly.

Every compile is counted: the first per step is its compile, any later one a recompile
(a new signature or guard answer of the step), reported in the metrics as ``recompiles``. Inductor keeps what it generated
in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the system's
temporary folder), so the same graph compiled again, in a second run, is read back rather
than generated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor, fx


CONFIG = {"fallback_random": True, "pattern_matcher": False}
"""TorchInductor's settings for a captured step. ``pattern_matcher`` off: with it, torch
2.13 miscompiles the double-backward graph of a Neumann-series hypergradient on
Meta-Weight-Net (relative error ~1 against the same graph run eagerly or through
AOTAutograd alone; ``tests/compiled`` compares every method's compiled step with its
eager one); the fusions it adds matter little beside the matrix products."""


@dataclass
class Counts:
    """What the compiler did for one step: compiles (backend calls), their seconds."""

    compiles: int = 0
    seconds: float = 0.0
    graphs: int = 0         # distinct captured graphs (input shapes) of the step
    operations: int = 0     # ATen operations in the last graph


@dataclass
class Compiled:
    """A compiled graph: ``run(*inputs)`` returns its flat outputs."""

    run: Callable[..., Sequence[Tensor]]
    counts: Counts = field(default_factory=Counts)


def compile_graph(graph: fx.GraphModule, counts: Counts) -> Callable[..., Sequence[Tensor]]:
    """``graph`` compiled with TorchInductor (lazily: the first call compiles, for the
    inputs it is given, counted in ``counts``)."""
    no_grad = torch.no_grad()
    compiled: list = []

    def run(*inputs: Tensor) -> Sequence[Tensor]:
        with no_grad:
            if not compiled:
                from torch._inductor.compile_fx import compile_fx
                counts.compiles += 1
                compiled.append(compile_fx(graph, list(inputs), config_patches=CONFIG))
            return compiled[0](*inputs)
    return run


def timed_first_call(run: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor],
                     counts: Counts) -> Sequence[Tensor]:
    """The first call of a compiled graph (where the compiling happens), timed into
    ``counts.seconds``."""
    start = time.perf_counter()
    out = run(*inputs)
    counts.seconds += time.perf_counter() - start
    return out
