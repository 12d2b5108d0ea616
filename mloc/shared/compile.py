"""What `--compile` does, torch-free: read by the runtime (`mloc.runtime.compiled`) and by
`mloc plan`, which says it before a run.

- `auto`'s rule (:mod:`mloc.runtime.compiled.decision` applies it): after `WARMUP` eager
  outer steps, compile when `steps left × median eager step × SAVING` exceeds the expected
  compile time, `STARTUP_SECONDS + GRAPH_SECONDS × step kinds + OP_SECONDS × operations`
  (the operations one eager outer step dispatched, counted at its first step);
- the schedule actions whose steps are captured.
"""

from __future__ import annotations

MODES = ("auto", "on", "off")
WARMUP = 5
SAVING = 0.3
STARTUP_SECONDS = 8.0
"""TorchInductor's one-time start-up in a process (imports, toolchain checks, workers):
8.2–12.8 s measured by bench/run_vs_betty.py on the 2-core machine."""
GRAPH_SECONDS = 1.0
"""Per compiled graph (a step kind), beside its operations."""
OP_SECONDS = 0.015
"""Per operation: fitted to first compiles on one thread (bench/run_vs_betty.py, the meta-batch
graphs of tests/compiled): 53 operations 0.2–3 s, 335 6–7 s, 468 8.5–11 s, 1049 13 s,
4416 40 s (the largest graphs compile faster per operation: an over-estimate there)."""

CAPTURED = ("lower_step", "upper_step", "accumulate", "chain_step", "meta_batch")
"""Schedule actions (`mloc.passes.schedule`) whose gradients `--compile on` captures as one
graph per step (an interlocking chain: every stage's; a vmapped meta-batch: every task's
solve and hypergradient); a lower or upper step's graph runs its problem's optimizer update
too where nothing acts between gradient and update (`mloc.runtime.compiled.fused`), and every
other optimizer commit is compiled apart."""

RULE = (f"auto (the default) runs {WARMUP} steps eagerly, then compiles when steps left × eager step × "
        f"{SAVING:.0%} > {STARTUP_SECONDS:.0f} s + {GRAPH_SECONDS:.0f} s per step kind + "
        f"{OP_SECONDS * 1e3:.0f} ms per operation of a step")
