"""What `--compile` does, torch-free: read by the runtime (`mloc.runtime.compiled`) and by
`mloc plan`, which says it before a run.

- `auto`'s rule (:mod:`mloc.runtime.compiled.decision` applies it): after `WARMUP` eager
  outer steps, compile when `steps left × median eager step × SAVING > COMPILE_SECONDS ×
  step kinds`;
- the schedule actions whose steps are captured.
"""

from __future__ import annotations

MODES = ("auto", "on", "off")
WARMUP = 5
SAVING = 0.3
COMPILE_SECONDS = 10.0

CAPTURED = ("lower_step", "upper_step", "accumulate", "chain_step", "meta_batch")
"""Schedule actions (`mloc.passes.schedule`) whose gradients `--compile on` captures as one
graph per step (an interlocking chain: every stage's; a vmapped meta-batch: every task's
solve and hypergradient); each problem's optimizer commit is compiled apart."""

RULE = (f"auto (the default) runs {WARMUP} steps eagerly, then compiles when steps left × eager step × "
        f"{SAVING:.0%} > {COMPILE_SECONDS:.0f} s per step kind")
