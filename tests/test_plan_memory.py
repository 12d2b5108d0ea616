"""The planner's memory estimate of each hypergradient step against an allocator-level
measurement (`mloc.runtime.base.memory.PeakMemory`), within `TOLERANCE` both ways.

One case per method and itd mode of the registry (`bench/plan_memory.py`'s
`registry_cases`: a method added to `mloc.builtins.METHODS` is measured here without a
line changed), and every example program as written. The bench's whole table (sizes
varied, long unrolls) is the slow tier's. To re-calibrate after a change to a method's
runtime: `python3 bench/plan_memory.py`, then the constants in `mloc/builtins/methods.py`.

The compiled estimate (`mloc plan`'s compiled column) against the compiled steps'
allocator-event peaks, one case per method and mode, same tolerance, in the slow tier
(each case compiles its steps: `python3 bench/plan_memory.py --compiled` prints the table).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "plan_memory.py"


def _bench():
    name = "bench_plan_memory"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


pm = _bench()


def check(case, compiled: bool = False) -> None:
    rows = list(pm.rows(case, compiled))
    for edge, method, estimate, measured in rows:
        assert estimate is not None, f"{case}: {edge} has no estimate (sizes not measured)"
        r = estimate / measured
        print(f"{case}: {edge} {method}: estimate {estimate / 1024:.1f} KiB, measured {measured / 1024:.1f} KiB, "
              f"ratio {r:.2f}")
        assert 1 / pm.TOLERANCE <= r <= pm.TOLERANCE, (
            f"{case}: {edge} {method}: estimate {estimate} B, measured {measured} B, ratio {r:.2f}")


@pytest.mark.parametrize("case", [c for _, c in pm.registry_cases()], ids=[i for i, _ in pm.registry_cases()])
def test_each_method_and_mode(case):
    check(case)


@pytest.mark.parametrize("case", pm.EXAMPLES, ids=[c.program for c in pm.EXAMPLES])
def test_each_example_as_written(case):
    check(case)


@pytest.mark.parametrize("case", pm.VMAP, ids=[str(c) for c in pm.VMAP])
def test_a_vectorized_meta_batch(case):
    """`vmap = true`: every task's step at once (the planner multiplies by the tasks)."""
    check(case)


def test_the_registry_cases_cover_every_method_and_mode():
    from mloc.builtins import METHODS
    from mloc.lang.vocabulary import ITD_MODES

    ids = {i for i, _ in pm.registry_cases()}
    assert {n for n, d in METHODS.items() if d.cost is not None} - {"itd"} <= ids
    assert {f"itd(mode={m})" for m in ITD_MODES if m != "auto"} <= ids


@pytest.mark.slow
@pytest.mark.parametrize("case", pm.CASES, ids=[str(c) for c in pm.CASES])
def test_the_bench_table(case):
    check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for _, c in pm.registry_cases()], ids=[i for i, _ in pm.registry_cases()])
def test_the_compiled_estimate_of_each_method_and_mode(case):
    """Every method and itd mode, its steps compiled: the planner's compiled estimate within
    the same tolerance of the allocator's measurement."""
    check(case, compiled=True)


COMPILED_ELSEWHERE = {"trilevel.mlo": "its top step's graph (3309 operations) compiles for minutes"}
"""Examples whose compiled steps are not measured here, and why."""


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in pm.EXAMPLES if c.program not in COMPILED_ELSEWHERE],
                         ids=[c.program for c in pm.EXAMPLES if c.program not in COMPILED_ELSEWHERE])
def test_the_compiled_estimate_of_each_example(case):
    """Every example as written, its steps compiled (`python3 bench/plan_memory.py --compiled
    --cases examples`): the compiled estimate within the same tolerance (imaml.mlo's cg,
    ten iterations in one graph, was 0.62 before the planner counted the vectors a compiled
    solver's inlined iterates keep: `mloc.runtime.base.inductor_memory.solver_vectors`)."""
    check(case, compiled=True)
