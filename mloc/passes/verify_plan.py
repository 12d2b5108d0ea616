"""The plan's invariants, verified after planning as the graph's are after every pass
(:func:`mloc.passes.pipeline.verify`). A broken one is a bug in mloc (exit 101), never the
user's fault. What a :class:`~mloc.passes.plan.Plan` promises codegen and the runtime:

- ``problems``: the graph's problems, in its order;
- ``edges``: one :class:`~mloc.passes.plan.EdgePlan` per hierarchy edge, each with a method
  the runtime executes: a registered descriptor with a runtime, resolved (not ``auto``, no
  ``mode = auto``), whose ``needs`` the lower problem's optimizer provides;
- ``order``: every problem once, each lower before its uppers (adjoints flow bottom-up);
- ``compositions``: one per problem with lowers (or none at all: a simultaneous game under
  ``exact``, which the runtime reports when built), each naming its top, with ``down`` the
  problems below the top (uppers first), every step's lower and inner targets among them and
  each lower once, seeds the top's loss reads, nested passes only under ``exact``
  semantics, and all of it what :func:`~mloc.ir.composition.compose` gives for the
  planned methods;
- ``periods``: what :func:`~mloc.passes.schedule.periods_of` gives for the planned edges;
- ``schedule``: one outer step, in which each problem that commits its own steps takes
  ``P / period`` optimizer steps (``P``: the largest period), each of them after
  ``accumulate`` micro-steps when it accumulates, and no action names an unknown problem.

Messages are bounded: at most :data:`LIMIT`, each one sentence naming what is wrong.
"""

from __future__ import annotations

from collections import Counter

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.ir.composition import Composition, below
from mloc.ir.graph import ProgramGraph
from mloc.ir.interlock import chains_of
from mloc.passes.plan import Plan, compositions_of, structure
from mloc.passes.schedule import Action, Loop, periods_of

LIMIT = 20
"""At most this many messages (the first ones found)."""


def verify_plan(plan: Plan, g: ProgramGraph) -> list[str]:
    """Every broken invariant of ``plan`` for the graph ``g`` it was planned from (empty: none).
    Each group is checked on a plan whose earlier groups hold (the compositions are
    recomputed from sound edges, the schedule counted against sound periods)."""
    errors: list[str] = []
    if tuple(plan.problems) != tuple(g.names()):
        errors.append(f"the plan's problems {list(plan.problems)} are not the graph's {list(g.names())}")
    errors += _edges(plan, g) + _order(plan, g)
    for check in (_compositions, _periods, _schedule):
        if errors:
            break
        errors += check(plan, g)
    return errors[:LIMIT]


def _periods(plan: Plan, g: ProgramGraph) -> list[str]:
    expected = periods_of(g, plan.edges)
    return [] if plan.periods == expected else [f"the periods {plan.periods} are not the planned edges' {expected}"]


def _edges(plan: Plan, g: ProgramGraph) -> list[str]:
    errors = []
    planned = Counter((e.upper, e.lower) for e in plan.edges)
    declared = {(e.upper, e.lower) for e in g.hierarchy_edges()}
    for pair in sorted(set(planned) | declared):
        if planned[pair] != (pair in declared):
            errors.append(f"edge {pair[0]} -> {pair[1]} is planned {planned[pair]} time(s) "
                          f"and declared {int(pair in declared)} time(s)")
    for e in plan.edges:
        desc = METHODS.get(e.method)
        where = f"edge {e.upper} -> {e.lower}"
        if desc is None or desc.runtime is None or desc.caps.planned:
            errors.append(f"{where} has method `{e.method}`, which the runtime does not execute")
        elif e.mode == "auto":
            errors.append(f"{where} keeps `mode = auto`: the planner did not choose a mode")
        elif (e.upper, e.lower) in declared:
            provides = OPTIMIZERS[g.problem(e.lower).optimizer.name].caps.provides
            if not desc.caps.needs <= provides:
                errors.append(f"{where}: `{e.method}` needs {sorted(desc.caps.needs - provides)} of the "
                              f"lower's optimizer, which does not provide it")
    return errors


def _order(plan: Plan, g: ProgramGraph) -> list[str]:
    if sorted(plan.order) != sorted(g.names()):
        return [f"the composition order {list(plan.order)} is not every problem once"]
    at = {n: i for i, n in enumerate(plan.order)}
    return [f"the composition order puts `{e.upper}` before its lower `{e.lower}`"
            for e in g.hierarchy_edges() if at[e.upper] < at[e.lower]]


def _compositions(plan: Plan, g: ProgramGraph) -> list[str]:
    uppers = sorted({e.upper for e in g.hierarchy_edges()})
    if not plan.compositions:
        return []
    if sorted(plan.compositions) != uppers:
        return [f"compositions are planned for {sorted(plan.compositions)}, not for the problems "
                f"with lowers {uppers}"]
    reads, ups = structure(g)
    lowers = {n: {low for low, us in ups.items() if n in us} for n in ups}
    errors = []
    for top, c in plan.compositions.items():
        found = _composition(top, c, reads, ups, below(lowers, top), plan.runtime_semantics)
        errors += [f"the composition of `{top}`: {e}" for e in found]
    if not errors:
        expected = compositions_of(g, plan.edges, plan.runtime_semantics)
        errors += [f"the composition of `{top}` is not what compose() gives for the planned methods"
                   for top, c in plan.compositions.items() if expected.get(top) != c]
    return errors


def _composition(top: str, c: Composition, reads: dict, uppers: dict, under: set[str],
                 semantics: str) -> list[str]:
    """The structural invariants of one upper's composition."""
    errors = []
    if c.top != top:
        errors.append(f"it names `{c.top}` as its top")
    if len(set(c.down)) != len(c.down) or set(c.down) != under:
        errors.append(f"`down` {list(c.down)} is not the problems below it, {sorted(under)}, each once")
    at = {n: i for i, n in enumerate(c.down)}
    errors += [f"`down` puts `{n}` before its upper `{u}`" for n in c.down for u in sorted(uppers[n])
               if u in at and at[u] > at[n]]
    steps = [n for n, _, _ in c.up]
    if len(set(steps)) != len(steps):
        errors.append(f"`up` steps a problem twice: {steps}")
    for n, inner, _ in c.up:
        if n not in under or not set(inner) <= under:
            errors.append(f"the step of `{n}` (to {list(inner)}) leaves the problems below it")
        later = set(steps[steps.index(n) + 1:])
        errors += [f"the step of `{n}` sends to `{t}`, whose step comes before it"
                   for t in inner if t in steps and t not in later]
    if not set(c.seeds) <= set(reads[top]) or not set(c.seeds) <= under | {top}:
        errors.append(f"the seeds {list(c.seeds)} are not problems its loss reads, at or below it")
    if c.nested and semantics != "exact":
        errors.append(f"it has nested passes under `{semantics}` semantics")
    for middle, _, nested_below in c.nested:
        if middle not in under or not set(nested_below) <= under:
            errors.append(f"the nested pass of `{middle}` leaves the problems below it")
    return errors


def _schedule(plan: Plan, g: ProgramGraph) -> list[str]:
    """Each problem's steps in one outer step (see the module docstring)."""
    names = set(g.names())
    counts: Counter = Counter()
    unknown = _count(plan.schedule, 1, counts, names, g)
    errors = [f"the schedule names `{n}`, which is not a problem" for n in sorted(unknown)]
    top = max(plan.periods.values(), default=1)
    unrolled = {e.lower for e in plan.edges if METHODS[e.method].caps.unrolls}
    for n in g.names():
        want = top // plan.periods[n]
        micro = g.problem(n).accumulate
        if n in unrolled:       # its steps are taken inside the upper's hypergradient
            continue
        if counts["step", n] != want:
            errors.append(f"the schedule steps `{n}` {counts['step', n]} time(s) per outer step, not {want}")
        elif micro > 1 and counts["micro", n] != want * micro:
            errors.append(f"the schedule takes {counts['micro', n]} micro-step(s) of `{n}` per outer step, "
                          f"not {want * micro}")
    return errors


def _count(loop: Loop, times: int, counts: Counter, names: set[str], g: ProgramGraph) -> set[str]:
    """Add up the optimizer steps (``"step"``) and micro-steps (``"micro"``) of each problem
    in ``loop`` run ``times`` times; the unknown problems it names."""
    unknown = set()
    for item in loop.body:
        if isinstance(item, Loop):
            unknown |= _count(item, times * item.repeat, counts, names, g)
            continue
        if item.problem not in names:
            unknown.add(item.problem)
            continue
        for key, n in _steps_of(item, g):
            counts[key, item.problem if n is None else n] += times
    return unknown


def _steps_of(a: Action, g: ProgramGraph) -> list[tuple[str, str | None]]:
    """What one action counts for: ``(kind, problem)``, None for the action's own problem."""
    if a.kind in ("lower_step", "upper_step", "apply"):
        return [("step", None)]
    if a.kind == "accumulate":
        return [("micro", None)]
    if a.kind == "meta_batch":
        (lower,) = g.lowers(a.problem)
        return [("step", None)] + [("micro", None)] * a.count + [("step", lower)] * (a.count * a.steps)
    if a.kind == "chain_step":
        chain = next((c for c in chains_of(g) if c.stages[0] == a.problem), None)
        return [("step", s) for s in (chain.stages if chain is not None else (a.problem,))]
    return []
