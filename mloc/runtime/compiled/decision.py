"""`--compile auto`: compile the training steps when that is expected to pay back.

After :data:`WARMUP` eager outer steps (the first one, which builds the steps and fills
caches, is not timed) the run knows what an eager step costs here, ``t``. Compiling is
expected to save a fraction :data:`SAVING` of it on each of the ``n`` steps left, and to
cost :data:`COMPILE_SECONDS` per step kind the schedule runs (each is captured and compiled
once). The rule:

    compile  ⇔  n · t · SAVING  >  kinds · COMPILE_SECONDS

The constants (in :mod:`mloc.shared.compile`, which `mloc plan` reads too) are measured
(`bench/run_vs_betty.py`'s compiled columns): a compiled step
took 0.55–0.7 × the eager one on the small Meta-Weight-Net models (SAVING 0.3 is the
cautious side), and a first compile 2–15 s per step on one CPU thread, less when
TorchInductor's on-disk cache already holds the graph. The decision, with its numbers,
is shown when it is made and recorded in `config.json`; `--compile on|off` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mloc.shared.compile import COMPILE_SECONDS, MODES, SAVING, WARMUP

__all__ = ["COMPILE_SECONDS", "MODES", "SAVING", "WARMUP", "Decision", "decide"]


@dataclass(frozen=True)
class Decision:
    """Whether to compile, and why (one line)."""

    compile: bool
    reason: str


def decide(steps_left: int, eager_step_seconds: float, kinds: int) -> Decision:
    """The rule of the module docstring for ``steps_left`` outer steps of
    ``eager_step_seconds`` each, with ``kinds`` step kinds to compile."""
    saving = steps_left * eager_step_seconds * SAVING
    cost = max(kinds, 1) * COMPILE_SECONDS
    why = (f"{steps_left} steps left × {eager_step_seconds * 1e3:.2f} ms per eager step × {SAVING:.0%} expected "
           f"saving = {saving:.1f} s {'>' if saving > cost else '≤'} {cost:.0f} s expected to compile "
           f"{kinds} step kind{'s' if kinds != 1 else ''}")
    return Decision(saving > cost, why)
