"""Every example program of `programs/`, as written, compiled (`--compile on`) against its
eager steps over 100 outer steps, in float64 (issue 25: "compiled and eager steps agree
... over 100 steps of every example"; "no recompilation in steady state").

Enumerated: a new `programs/*.mlo` is in the test without a line changed here. Each step is
compared from the eager state within `test_compiled_steps._agree`'s bound (1e-12 relative,
or 100 × what one ulp of noise on the parameters changes in the eager step: an example's
conditioning is its own), every step of the program is compiled (an optimizer that refuses
a compiled commit is named by `_agree`), and the run's own counts (graphs + recompiles of
every step) do not change after the first `WARMUP` steps: zero recompiles per step in steady
state.

Exceptions, each with its reason:

- `trilevel.mlo` (:data:`ELSEWHERE`): its top step is one graph of 3309 operations that takes
  minutes to compile on one thread; `tests/compiled/test_compiled_programs.py` compiles the
  same three-level structure with one Neumann iteration per edge.
- `shampoo_reweighting.mlo` (:data:`EAGER`): its upper step runs eagerly, as its run says
  (SAMA's diagonal of Shampoo is host work); the test checks that, and every other step.

Time: one process for all examples (a graph compiled for one example is not shared with
another, their graphs differ; TorchInductor's on-disk cache makes a second run of this test
read the generated code back). Measured 2026-12-02 on the 2-core machine under a load
average of 10–12 (`docs/runtime.md`, "Compiled steps", has the per-example figures): about
75 minutes in all, darts 2392 s of it (its first compile 1586 s), hpo 400 s, imaml 241 s,
lbi 219 s, the others 15–84 s each (their Inductor cache partly warm from 4-step runs; lbi's
first step alone compiled for 1169 s cold).
"""

from __future__ import annotations

import time

import pytest

from tests.compiled.test_compiled_steps import _agree
from tests.conftest import ROOT

PROGRAMS = ROOT / "programs"
ELSEWHERE = {"trilevel.mlo": "tests/compiled/test_compiled_programs.py (its full top graph compiles for minutes)"}
STEPS = 100
WARMUP = {"shampoo_reweighting.mlo": 12}
"""Steps after which nothing compiles again: 5 (SGD's first momentum step is a second graph;
a last smaller batch one more), 12 where Shampoo starts preconditioning at step 10 (its
compiled direction changes inputs once: the roots)."""
EAGER = {"shampoo_reweighting.mlo": {"upper weight_net": "SAMA's diagonal of Shampoo does root work on the host"}}
"""Steps an example runs eagerly, by design, with the reason its run gives: the upper step
of SAMA over Shampoo (the diagonal waits for the background root jobs and installs the
roots due: host work a graph cannot replay). The other steps are compiled and checked."""
EXAMPLES = sorted(p.name for p in PROGRAMS.glob("*.mlo") if p.name not in ELSEWHERE)


def test_the_exceptions_are_examples():
    """An exception that names no example is stale."""
    assert set(ELSEWHERE) | set(EAGER) <= {p.name for p in PROGRAMS.glob("*.mlo")}


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_compiled_equals_eager_over_100_steps(example):
    start, reports = time.perf_counter(), []
    worst = _agree(None, None, "float64", STEPS, 1e-12, warmup=WARMUP.get(example, 5), program=PROGRAMS / example,
                   reports=reports, eager_steps=EAGER.get(example))
    compile_s = sum(r.seconds for r in reports)
    print(f"\n{example}: worst {worst:.3g} (bound 1e-12), {STEPS} steps, "
          f"recompiles {sum(r.recompiles for r in reports)} in all, none after warm-up; compile {compile_s:.0f} s; "
          f"{time.perf_counter() - start:.0f} s; " + "; ".join(r.line() for r in reports))
