"""Example programs of `programs/` beyond two levels, compiled (`--compile on`) against
their eager steps, within `test_compiled_steps`'s bounds (float64: 1e-12 relative, or 100 ×
one ulp of parameter noise's effect, per step, from the same state).

`programs/trilevel.mlo` under `exact` semantics: the top step differentiates through the
middle's reduced objective, whose Hessian-vector products each run a differentiable
Neumann pass through the classifier. Its top graph is the largest mloc captures (3309
operations with the program's `neumann(iters=3)` at both edges); here both edges run one
Neumann iteration, the same three-level structure (every kind of nested product) in a
smaller graph, so that the compile fits the slow tier. Measured 2026-12-02: over 6 steps every
step within 2.1e-16 relative of the eager one, 892 s of wall time on the 2-core machine under
a load average of 17–20 (others' jobs), nearly all of it capturing and compiling the three
steps; over 100 steps (as now) 2.2e-16, 28 s with TorchInductor's cache warm from that run
(the 100 steps themselves are seconds: the compile is the cost).
"""

from __future__ import annotations

import time

import pytest

from tests.compiled.test_compiled_steps import _agree
from tests.conftest import ROOT

THREE_LEVEL = ("strength->weight_net.hypergrad=neumann(iters=1, alpha=0.1)",
               "weight_net->classifier.hypergrad=neumann(iters=1, alpha=0.1)")


@pytest.mark.slow
def test_a_three_level_program_compiled_equals_eager():
    start = time.perf_counter()
    worst = _agree(None, None, "float64", 100, 1e-12, warmup=3, program=ROOT / "programs" / "trilevel.mlo",
                   extra=THREE_LEVEL)
    print(f"trilevel, compiled vs eager: worst {worst:.3g} of 1e-12 in {time.perf_counter() - start:.0f} s")

