"""The planner's decisions on cost-model cases, with sizes given as the dataflow pass
would measure them (no user code runs here)."""

from __future__ import annotations

import pytest

from pathlib import Path

from mloc.builtins import METHODS
from mloc.passes.pipeline import compile_source
from mloc.passes.plan import Sizes, plan_program, plan_table, plan_to_json
from mloc.source import SourceFile

HERE = Path(__file__).parent / "planner"
MiB = 2**20

TEMPLATE = """program p
import lib
semantics = {semantics}
problem low {{
    module = lib.Model(width=4)
    data = lib.loader()
    loss = lib.loss(low, high, batch)
    optimizer = sgd(lr=0.1)
}}
problem high {{
    module = lib.Hyper(width=1)
    data = lib.loader()
    loss = lib.loss(low, batch)
    optimizer = adam(lr=0.01)
}}
high -> low {{ hypergrad = {method}, unroll = {unroll} }}
train {{ steps = 10 {budget} }}
"""


def plan_for(method="auto", unroll=1, budget=None, sizes=None, semantics="exact"):
    text = TEMPLATE.format(method=method, unroll=unroll, semantics=semantics,
                           budget=f"memory_budget = {budget}" if budget else "")
    unit = compile_source(SourceFile(str(HERE / "p.mlo"), text))
    assert unit.ok, [d.message for d in unit.diagnostics]
    return plan_program(unit.graph, sizes)


SMALL_UPPER = Sizes(params={"low": 1_000_000, "high": 2}, activations={"low": 8 * MiB})


def test_forward_mode_for_few_hyperparameters_and_a_long_unroll():
    # d = 1e6 parameters (D = 3.8 MiB), A = 8 MiB of activations, sgd without momentum (no
    # state), G = A + D and H = G + 3 A + D (the planner's fallback where the graph and the
    # product were not measured), K = 100: reverse keeps 99 graphs (1.2 GiB); recompute 10
    # checkpoints and a 10-step segment (19 iterates) and one rebuilt step (127 MiB);
    # forward the 2 tangents, old and new, two graphs and a batch of 2 directions (97 MiB).
    # Under 130 MiB both fit and recompute is faster; under 100 MiB only forward fits;
    # without a budget, reverse is fastest.
    roomy = plan_for("itd(mode=auto)", unroll=100, budget='"130MiB"', sizes=SMALL_UPPER).edge("high", "low")
    assert roomy.mode == "recompute" and "recompute keeps 10 checkpoints and one 10-step segment" in roomy.reason
    assert 120 * MiB < roomy.memory <= 130 * MiB
    e = plan_for("itd(mode=auto)", unroll=100, budget='"100MiB"', sizes=SMALL_UPPER).edge("high", "low")
    assert e.mode == "forward"
    assert "forward mode carries d×m" in e.reason and "the only mode that fits" in e.reason
    assert e.memory <= 100 * MiB
    assert plan_for("itd(mode=auto)", unroll=100, sizes=SMALL_UPPER).edge("high", "low").mode == "reverse"
    # forward keeps O(d·m) numbers and one step's graphs; reverse would keep 99 graphs
    reverse = plan_for("itd(mode=reverse)", unroll=100, sizes=SMALL_UPPER).edge("high", "low")
    assert e.memory < reverse.memory / 10


def test_itd_costs_per_mode():
    """The cost model's formulas (`mloc.builtins.methods.itd_time`, `itd_memory`) at a
    hand-computed point: d = 1e6, A = 8 MiB, m = 2, K = 100 (T = 100, or truncate 36), sgd
    without momentum (S = 0), the graph and the product estimated from A (G, H)."""
    d, act, b = 1_000_000, 8 * MiB, 4
    vec = d * b
    graph = act + vec
    hvp = graph + 3 * act + vec
    edge = lambda method: plan_for(method, unroll=100, sizes=SMALL_UPPER).edge("high", "low")  # noqa: E731
    rev, rec, fwd = (edge(f"itd(mode={m})") for m in ("reverse", "recompute", "forward"))
    assert (rev.time_g, rev.memory) == (400, 99 * graph + hvp + vec)
    # c = 10: 10 checkpoints and a segment of 10 iterates that starts at one of them
    assert (rec.time_g, rec.memory) == (400 + 2 * (200 - 10), (10 + 10 - 1) * vec + 4 * vec + hvp)
    # the tangents of θ, old and new (2 · m · D), two graphs, a batch of m = 2 directions
    assert (fwd.time_g, fwd.memory) == (100 * (10 + 2),
                                        int(graph + hvp + 2 * 2 * vec + 2 * (0.55 * (hvp - graph) + 2 * b)))
    cut = edge("itd(truncate=36, mode=recompute)")     # c = 6: 6 checkpoints, 6-step segments
    assert (cut.time_g, cut.memory) == (2 * 64 + 4 * 36 + 2 * (72 - 6), (6 + 6 - 1) * vec + 4 * vec + hvp)


def test_reverse_mode_when_the_upper_is_large():
    sizes = Sizes(params={"low": 1_000_000, "high": 5_000}, activations={"low": 8 * MiB})
    e = plan_for("itd(mode=auto)", unroll=20, sizes=sizes).edge("high", "low")
    assert e.mode == "reverse" and "fastest" in e.reason


def test_recompute_under_a_small_budget():
    # K = 20: reverse keeps 19 graphs (~268 MiB), recompute 4 checkpoints and a 5-step
    # segment (8 iterates, no momentum) and one rebuilt step (~85 MiB); forward's 5000
    # directions do not fit
    sizes = Sizes(params={"low": 1_000_000, "high": 5_000}, activations={"low": 8 * MiB})
    e = plan_for("itd(mode=auto)", unroll=20, budget='"100MiB"', sizes=sizes).edge("high", "low")
    assert e.mode == "recompute" and "exceed the budget" in e.reason
    assert e.memory <= 100 * MiB


def test_auto_method_under_budgets():
    sizes = Sizes(params={"low": 10_000_000, "high": 100}, activations={"low": 64 * MiB})
    assert plan_for(sizes=sizes).edge("high", "low").method == "cg"
    per_edge = "per_edge"
    # d = 1e7 (38 MiB a vector), 64 MiB of activations: cg holds one Hessian-vector product
    # (its graph, ~3 activations of temporaries) and 4 vectors, ~485 MiB; sama and
    # finite_diff 3 vectors and two perturbed forwards, ~242 MiB each
    roomy = plan_for(budget='"500MiB"', sizes=sizes, semantics=per_edge).edge("high", "low")
    assert roomy.method == "cg"
    tight = plan_for(budget='"300MiB"', sizes=sizes, semantics=per_edge).edge("high", "low")
    assert tight.method == "sama" and "exceed the budget" in tight.reason
    # nothing fits: the least memory; finite_diff holds what sama holds (measured), so
    # sama, the better tier, is the smallest
    tighter = plan_for(budget='"110MiB"', sizes=sizes, semantics=per_edge).edge("high", "low")
    assert tighter.method == "sama" and "nothing fits" in tighter.reason


def test_every_decision_has_a_reason_and_the_plan_prints():
    plan = plan_for("neumann(iters=3, alpha=0.1)", unroll=5, sizes=SMALL_UPPER)
    assert all(e.reason for e in plan.edges) and plan.semantics_reason
    table = plan_table(plan)
    assert "high -> low" in table and "repeat 5:" in table
    data = plan_to_json(plan)
    assert data["edges"][0]["method"] == "neumann" and data["periods"] == {"high": 5, "low": 1}
    assert data["composition_order"] == ["low", "high"]


# --- compositions: planned once, executed by the runtime -----------------------------

SHAPES = {"finite_diff": "bound", "sama": "bound", "cg(iters=3)": "single", "neumann": "single",
          "itd(steps=2, mode=reverse)": "fused", "itd(steps=2, mode=forward)": "general",
          "first_order": "general"}


def test_each_method_plans_its_step_shape():
    for method, shape in SHAPES.items():
        plan = plan_for(method, unroll=2, semantics="per_edge")
        c = plan.compositions["high"]
        assert (c.down, c.seeds, c.shape) == (("low",), ("low",) if method != "first_order" else (), shape)
        assert plan_to_json(plan)["compositions"]["high"]["shape"] == shape


CASES = [("data_reweighting", ()), ("maml", ()), ("hpo", ()), ("trilevel", ()),
         ("maml", ("meta->adapt.hypergrad=first_order",))]


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}{'+' if o else ''}{','.join(o)}" for n, o in CASES])
def test_the_planned_compositions_are_the_runtimes(name, overrides):
    """The planned compositions (emitted as the declaration's `compositions`) are what the
    same function computes for a hierarchy built by hand from the problems the runtime builds
    (their reads include the `init` problems) and its own method objects: one function, one
    table of capabilities."""
    from mloc.codegen.compile import compile_program, load_generated
    from mloc.ir.composition import compositions_of
    from mloc.runtime.program.engine import RunConfig
    from mloc.runtime.processes.launch import build
    from tests.conftest import PROGRAMS, ROOT
    c = compile_program(str(PROGRAMS / f"{name}.mlo"), overrides, out_dir=ROOT / "build" / name)
    declaration = load_generated(c.source, str(ROOT / "build" / name / "train.py"))
    planned = declaration.compositions
    assert planned == c.plan.compositions and planned
    program = build(declaration, RunConfig(steps=1, seed=0, device="cpu", precision="fp32"))
    hierarchy = program.hierarchy
    assert compositions_of(hierarchy.problems.values(), hierarchy.edges, hierarchy.semantics) == planned


@pytest.mark.parametrize("method", ["first_order", "itd"])
def test_an_init_problem_is_reset_once_per_upper_step_before_its_unrolled_steps(method):
    """`reset` opens the upper's step, outside the loop of the lower's `unroll` steps (it
    used to sit inside it, so every lower step started again from `init`)."""
    from mloc.codegen.compile import compile_program
    from tests.conftest import PROGRAMS
    c = compile_program(str(PROGRAMS / "maml.mlo"), (f"meta->adapt.hypergrad={method}",))
    schedule = plan_to_json(c.plan)["schedule"]
    unrolls = METHODS[method.split("(")[0]].caps.unrolls
    lower = [{"action": "draw", "problem": "adapt", "count": 1}] if unrolls else \
        [{"repeat": 5, "body": [{"action": "lower_step", "problem": "adapt", "count": 1}]}]
    assert schedule == [{"action": "reset", "problem": "adapt", "count": 1}, *lower,
                        {"action": "upper_step", "problem": "meta", "count": 1}]
