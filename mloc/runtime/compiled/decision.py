"""`--compile auto`: compile the training steps when that is expected to pay back.

After :data:`WARMUP` eager outer steps (the first one, which builds the steps and fills
caches, is not timed) the run knows what an eager step costs here, ``t``, and, from its
first step (:class:`OpCount`), how many operations an outer step dispatches, ``ops``.
Compiling is expected to save a fraction :data:`SAVING` of ``t`` on each of the ``n`` steps
left, and to cost TorchInductor's start-up plus, per step kind the schedule runs (each is
captured and compiled once), a graph's fixed cost and its operations' share. The rule:

    compile  ⇔  n · t · SAVING  >  STARTUP_SECONDS + kinds · GRAPH_SECONDS + ops · OP_SECONDS

The constants (in :mod:`mloc.shared.compile`, which `mloc plan` reads too) are measured
(`bench/run_vs_betty.py`'s compiled columns): a compiled step took 0.61–0.81 × the eager
one on the small Meta-Weight-Net models (SAVING 0.3 is the cautious side), and compile
times grow with the graph's operations. TorchInductor's on-disk cache makes a second run
cheaper than this expects. The decision, with its numbers, is shown when it is made and
recorded in `config.json`; `--compile on|off` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

from mloc.shared.compile import GRAPH_SECONDS, MODES, OP_SECONDS, SAVING, STARTUP_SECONDS, WARMUP

__all__ = ["MODES", "SAVING", "WARMUP", "Decision", "OpCount", "decide", "compile_seconds"]


@dataclass(frozen=True)
class Decision:
    """Whether to compile, and why (one line)."""

    compile: bool
    reason: str


class OpCount(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is active (``n``), each run as it is:
    what a capture of the same step would record, give or take views."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def compile_seconds(kinds: int, operations: int) -> float:
    """The expected first-compile time of ``kinds`` step kinds of ``operations`` in all."""
    return STARTUP_SECONDS + max(kinds, 1) * GRAPH_SECONDS + operations * OP_SECONDS


def decide(steps_left: int, eager_step_seconds: float, kinds: int, operations: int) -> Decision:
    """The rule of the module docstring for ``steps_left`` outer steps of
    ``eager_step_seconds`` each, with ``kinds`` step kinds of ``operations`` to compile."""
    saving = steps_left * eager_step_seconds * SAVING
    cost = compile_seconds(kinds, operations)
    why = (f"{steps_left} steps left × {eager_step_seconds * 1e3:.2f} ms per eager step × {SAVING:.0%} expected "
           f"saving = {saving:.1f} s {'>' if saving > cost else '≤'} {cost:.0f} s expected to compile "
           f"{kinds} step kind{'s' if kinds != 1 else ''} of {operations} operations")
    return Decision(saving > cost, why)
