"""What `--compile` does, torch-free: read by the runtime (`mloc.runtime.compiled`) and by
`mloc plan`, which says it before a run.

- `auto`'s rule (:mod:`mloc.runtime.compiled.decision` applies it): after `WARMUP` eager
  outer steps, compile when `steps left × median eager step × SAVING > COMPILE_SECONDS ×
  step kinds`;
- the schedule actions whose steps are not captured, and why (they run eagerly, and a
  compiled run says so for each).
"""

from __future__ import annotations

MODES = ("auto", "on", "off")
WARMUP = 5
SAVING = 0.3
COMPILE_SECONDS = 10.0

NOT_CAPTURED = {
    "chain_step": "not captured: its stages commit one after another inside the step",
    "meta_batch": "not captured: its tasks' solves, vectorized with vmap, commit inside the step",
}
"""Schedule actions (`mloc.passes.schedule`) that run eagerly under `--compile on`, and why."""

RULE = (f"auto (the default) runs {WARMUP} steps eagerly, then compiles when steps left × eager step × "
        f"{SAVING:.0%} > {COMPILE_SECONDS:.0f} s per step kind")
