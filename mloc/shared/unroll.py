"""How `itd`'s memory-saving modes divide their work: one home for the runtime
(`mloc.runtime.methods.unrolled`, which does it) and the planner's cost model
(`mloc.builtins.methods`, which prices it). Torch-free, import-free.

- recompute: checkpoints every ``c = ⌈√T⌉`` steps of a ``T``-step unroll, so ``⌈T/c⌉``
  checkpoints and at most ``c`` recomputed iterates are live at once (≤ ``2⌈√T⌉``).
- forward: the tangent directions go through one batched backward
  :data:`DIRECTIONS_PER_BATCH` at a time (the batch's intermediates are that many copies of
  one direction's).
"""

from __future__ import annotations

from math import isqrt

DIRECTIONS_PER_BATCH = 32


def segment_length(steps: int) -> int:
    """``c = ⌈√T⌉`` (1 for ``T ≤ 1``)."""
    return isqrt(steps - 1) + 1 if steps > 1 else 1


def checkpoints(steps: int) -> int:
    """``⌈T/c⌉``: the iterates recompute mode keeps through the whole sweep."""
    return -(-steps // segment_length(steps)) if steps > 0 else 0
