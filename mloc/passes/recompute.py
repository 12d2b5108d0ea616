"""Whether the run checkpoints its modules' activations: the planner's decision under
`memory_budget`, with its reason (the plan's `activation checkpointing:` line).

The rule: with a `memory_budget`, checkpointing is on when the largest estimated peak of a
hypergradient step (each edge's `EdgePlan.memory`, after the planner chose its method)
exceeds the budget; off when every estimate fits; off, and said so, when no step's memory is
estimated. Without a budget nothing is decided (no line). When on, each module's children
that hold parameters recompute their activations in the backward
(:mod:`mloc.runtime.base.recompute`). The estimate is not lowered by it: the planner's
memory model does not model recomputation, so the line says the budget was exceeded, not
that it is now met.
"""

from __future__ import annotations

from typing import Sequence


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def decide(edges: Sequence, budget: int | None) -> tuple[bool, str] | None:
    """``(on, reason)`` for the planned ``edges`` (``EdgePlan``s) under ``budget`` bytes, or
    None without a budget."""
    if not budget:
        return None
    known = [e for e in edges if e.memory is not None]
    if not known:
        return False, "off: no step's memory is estimated (the sizes were not measured)"
    top = max(known, key=lambda e: e.memory)
    where = f"{top.upper} -> {top.lower}, {top.method}"
    if top.memory <= budget:
        return False, (f"off: every estimated step peak fits memory_budget {_bytes(budget)} "
                       f"(the largest {_bytes(top.memory)}, {where})")
    return True, (f"on: the estimated step peak {_bytes(top.memory)} ({where}) exceeds memory_budget "
                  f"{_bytes(budget)}; each module's children with parameters recompute their activations "
                  "in the backward (the estimate does not model it)")
