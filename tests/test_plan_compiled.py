"""The planner's compiled-step estimate (`EdgePlan.compiled_memory`, from `Sizes.compiled`):
priced with the same memory model as the eager one, shown beside it, and held against the
memory budget under `--compile on` only (`auto`'s first steps and `off` run eagerly)."""

from __future__ import annotations

from mloc.passes.pipeline import compile_source
from mloc.passes.plan import Sizes, plan_program, plan_table, plan_to_json
from mloc.source import SourceFile
from tests.test_planner import HERE, TEMPLATE, MiB, plan_for

D = 1_000_000 * 4
# an unrolled step's graph G and a product's peak H: eager 12 and 40 MiB; compiled (what
# Inductor keeps of them) 4 and 20 MiB
SIZES = Sizes(params={"low": 1_000_000, "high": 2}, activations={"low": 8 * MiB},
              graphs={"low": 12 * MiB}, hvps={"low": 40 * MiB},
              compiled={"low": {"activations": 2 * MiB, "graph": 4 * MiB, "hvp": 20 * MiB}})


def _plan(compile: str, budget: str | None = '"150MiB"'):
    text = TEMPLATE.format(method="itd(mode=auto)", unroll=20, semantics="exact",
                           budget=f"memory_budget = {budget}" if budget else "")
    return plan_program(compile_source(SourceFile(str(HERE / "p.mlo"), text)).graph, SIZES, compile)


def test_both_estimates_are_the_same_model_on_the_two_sizes():
    # reverse, K = 20: 19 step graphs, a product's peak, the adjoint (mloc.builtins.methods)
    e = _plan("auto", budget=None).edge("high", "low")
    assert e.mode == "reverse"
    assert e.memory == 19 * 12 * MiB + 40 * MiB + D
    assert e.compiled_memory == 19 * 4 * MiB + 20 * MiB + D


def test_the_budget_holds_the_compiled_estimate_only_under_compile_on():
    # 150 MiB: reverse's eager 272 MiB do not fit (recompute does); compiled, its 100 MiB do
    for mode in ("auto", "off"):
        e = _plan(mode).edge("high", "low")
        assert e.mode == "recompute" and e.memory <= 150 * MiB, mode
    on = _plan("on")
    e = on.edge("high", "low")
    assert e.mode == "reverse" and e.compiled_memory <= 150 * MiB < e.memory
    assert "held against the compiled estimates" in plan_table(on)
    assert plan_to_json(on)["edges"][0]["compiled_memory_bytes"] == e.compiled_memory


def test_the_table_shows_the_compiled_column_unless_compile_is_off():
    header = plan_table(_plan("auto")).splitlines()[0].split()
    assert header[:5] == ["edge", "method", "mode", "memory", "compiled"]
    assert "compiled" not in plan_table(_plan("off")).splitlines()[0]


def test_without_compiled_sizes_the_compiled_estimate_is_the_eager_one():
    sizes = Sizes(params={"low": 1_000_000, "high": 2}, activations={"low": 8 * MiB})
    e = plan_for("itd(mode=reverse)", unroll=5, sizes=sizes).edge("high", "low")
    assert e.compiled_memory == e.memory
