"""The built-in descriptors (`mloc.builtins`) agree with the checker, the planner and the
runtime: parametrized from the registries, so a new built-in is covered when it is declared."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from mloc.builtins import METHODS, OPTIMIZERS, REQUIRED, SCHEDULES, TABLES, Shape
from mloc.lang.types import Bool, Enum, ListOf, Number
from mloc.passes.pipeline import compile_source
from mloc.passes.plan import Sizes, plan_program
from mloc.source import SourceFile

HERE = Path(__file__).parent / "planner"          # its lib.py: Model, Hyper, loader, loss

ALL = [(kind, d) for kind, table in TABLES.items() for d in table.values()]
RUNNABLE = [(kind, d) for kind, d in ALL if d.runtime is not None]
PENDING = [(kind, d) for kind, d in ALL if not d.executable]

TEMPLATE = """program p
import lib
problem low {{
    module = lib.Model(width=4)
    data = lib.loader()
    loss = lib.loss(low, high, batch)
    optimizer = {lower}
    {schedule}
}}
problem high {{
    module = lib.Hyper(width=1)
    data = lib.loader()
    loss = lib.loss(low, batch)
    optimizer = adam(lr=0.01)
}}
high -> low {{ hypergrad = {method}, unroll = 2 }}
train {{ steps = 10 }}
"""


def _example(t) -> str:
    """A literal of type `t` (for a required argument)."""
    if isinstance(t, Enum):
        return t.choices[0]
    if isinstance(t, Bool):
        return "true"
    if isinstance(t, Number):
        return "2" if t.integer else "0.5"
    if isinstance(t, ListOf):
        return f"[{_example(t.item)}]"
    raise NotImplementedError(f"no example literal for {t!r}")


def _value(t):
    """The Python value the checker makes of `_example(t)`."""
    if isinstance(t, ListOf):
        return (_value(t.item),)
    return 2 if t.integer else 0.5


def _call(d) -> str:
    required = [f"{p.name}={_example(p.type)}" for p in d.signature.params if p.default is REQUIRED]
    return f"{d.name}({', '.join(required)})"


def check(lower="sgd(lr=0.1)", method="cg", schedule=""):
    text = TEMPLATE.format(lower=lower, method=method, schedule=schedule)
    return text, compile_source(SourceFile(str(HERE / "p.mlo"), text))


def _ids(pairs):
    return [f"{kind}:{d.name}" for kind, d in pairs]


@pytest.mark.parametrize(("kind", "d"), RUNNABLE, ids=_ids(RUNNABLE))
def test_runtime_factory_takes_the_signature(kind, d):
    """The factory loads, and its parameters start with the signature's, in order; any
    further ones have defaults (`base` is the one codegen passes to a `takes_base` schedule)."""
    factory = d.load()
    assert callable(factory)
    params = list(inspect.signature(factory).parameters.values())
    names = [p.name for p in d.signature.params]
    assert [p.name for p in params[:len(names)]] == names
    extra = params[len(names):]
    assert all(p.default is not inspect.Parameter.empty for p in extra), extra
    if getattr(d.caps, "takes_base", False):
        assert "base" in [p.name for p in extra]


@pytest.mark.parametrize(("kind", "d"), RUNNABLE, ids=_ids(RUNNABLE))
def test_runtime_factory_builds_with_the_checker_defaults(kind, d):
    required = {p.name: _value(p.type) for p in d.signature.params if p.default is REQUIRED}
    defaults = {p.name: p.default for p in d.signature.params if p.default is not REQUIRED}
    if d.name == "itd":
        defaults.update(steps=2, mode="reverse")    # the checker fills steps; the planner the mode
    d.load()(**required, **defaults)


@pytest.mark.parametrize(("kind", "d"), PENDING, ids=_ids(PENDING))
def test_a_builtin_without_runtime_is_E704_at_check(kind, d):
    call = _call(d)
    field = {"optimizers": "lower", "methods": "method", "schedules": "schedule"}[kind]
    value = call if kind != "schedules" else f"schedule = {call}"
    text, unit = check(**{field: value})
    assert not unit.ok
    line = next(i for i, t in enumerate(text.splitlines(), 1) if call in t)
    col = text.splitlines()[line - 1].index(call) + 1
    assert ("E704", line, col) in [(x.code, x.span.line, x.span.col) for x in unit.diagnostics]
    assert unit.resolved is not None        # the call was still bound: later checks ran


def test_planned_methods_are_executable_without_runtime():
    planned = [d for d in METHODS.values() if d.caps.planned]
    assert [d.name for d in planned] == ["auto"]
    assert all(d.executable and d.runtime is None and d.cost is None for d in planned)


@pytest.mark.parametrize("d", [d for d in METHODS.values() if not d.caps.planned], ids=lambda d: d.name)
def test_every_method_but_auto_has_a_cost(d):
    assert d.cost is not None
    args = {p.name: (None if p.default is REQUIRED else p.default) for p in d.signature.params}
    modes = ("reverse", "forward", "recompute") if d.caps.unrolls else (None,)
    for mode in modes:
        a = {**args, "mode": mode} if mode else args
        time, memory = d.cost(a, Shape(d=1000, act=4096, m=10, b=4))
        assert time > 0 and isinstance(memory, int) and memory > 0
        assert d.cost(a, Shape())[1] is None            # sizes not measured: memory unknown


def test_the_planner_prices_what_auto_chooses():
    unit = check(method="auto")[1]
    plan = plan_program(unit.graph, Sizes(params={"low": 100, "high": 2}, activations={"low": 800}))
    e = plan.edge("high", "low")
    assert e.method != "auto" and METHODS[e.method].cost is not None and e.memory is not None
    # the state the lower's optimizer keeps: none for sgd without momentum, its descriptor's
    # state_per_param (a momentum buffer) with momentum
    assert e.state_memory == 0
    unit = check(lower="sgd(lr=0.1, momentum=0.9)", method="auto")[1]
    plan = plan_program(unit.graph, Sizes(params={"low": 100, "high": 2}, activations={"low": 800}))
    assert plan.edge("high", "low").state_memory == OPTIMIZERS["sgd"].caps.state_per_param * 100 * 4


PAIRS = [(m, o) for m in METHODS.values() for o in OPTIMIZERS.values()]


@pytest.mark.parametrize(("method", "opt"), PAIRS, ids=[f"{m.name}-{o.name}" for m, o in PAIRS])
def test_E401_exactly_when_the_optimizer_lacks_what_the_method_needs(method, opt):
    _, unit = check(lower=_call(opt), method=_call(method))
    codes = {x.code for x in unit.diagnostics}
    assert ("E401" in codes) == bool(method.caps.needs - opt.caps.provides)
    assert ("E704" in codes) == (not opt.executable)
    if opt.executable and not method.caps.needs - opt.caps.provides:
        assert unit.ok, [x.message for x in unit.diagnostics]


def test_optimizer_capabilities_are_ones_methods_can_ask_for():
    asked = set().union(*(m.caps.needs for m in METHODS.values()))
    offered = set().union(*(o.caps.provides for o in OPTIMIZERS.values()))
    assert asked <= {"differentiable", "sama_diag"} and asked <= offered


def test_schedule_factories_are_named_by_their_descriptors():
    assert SCHEDULES["step"].runtime == "mloc.runtime.program.schedules:step_decay"
    assert [n for n, d in SCHEDULES.items() if d.caps.identity] == ["constant"]


VMAP_SOLVERS = [d for d in METHODS.values() if d.caps.task_vmap and not d.caps.no_indirect and d.runtime]


@pytest.mark.parametrize("d", VMAP_SOLVERS, ids=lambda d: d.name)
def test_a_method_declaring_task_vmap_offers_solve(d):
    """`task_vmap` without `no_indirect` promises the meta-batch a `solve(op, v)` (what the
    vectorized meta-batch calls; `mloc check` trusts the declaration, E219 otherwise)."""
    defaults = {p.name: p.default for p in d.signature.params if p.default is not REQUIRED}
    assert callable(getattr(d.load()(**defaults), "solve", None))


@pytest.mark.parametrize("d", [d for d in OPTIMIZERS.values() if d.runtime], ids=lambda d: d.name)
def test_an_optimizer_steps_with_its_descriptors_record(d):
    """The implementation holds the record the signature was read from, and its rate is
    the record's `RATE` field."""
    required = {p.name: _value(p.type) for p in d.signature.params if p.default is REQUIRED}
    opt = d.load()(**required)
    assert type(opt.hyper) is d.hyper and opt.rate == getattr(opt.hyper, d.rate)
