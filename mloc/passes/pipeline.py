"""The compile pipeline's parts: the compilation `Unit`, the `Pass` contract, the passes up
to the plan, and the loop that runs them.

    parse -> resolve -> lower -> hierarchy -> dataflow -> runnable   CHECKS: what `mloc check` runs
          -> trace -> support -> plan -> emit               the rest of `mloc.codegen.compile.PIPELINE`

The check passes read only the `.mlo` file (no torch, no user code). They collect every
independent error: a pass that cannot run on what came before is skipped, and their
diagnostics are reported sorted by location. The compile passes run only on a program
without errors, each on the previous one's result, and add what they find in order.
`emit` writes code, so it and the full `PIPELINE` live one layer up, in `mloc.codegen`.

Each pass is a frozen dataclass that takes a `Unit` and returns a new one; no pass mutates
the unit or graph it is given. After every pass the graph's invariants are verified, and
the plan's once there is one (`mloc.passes.verify_plan`): a violation is a bug in mloc
(`InternalError`), never the user's fault.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from mloc.diagnostics import Diagnostic, DiagnosticError, Diagnostics
from mloc.frontend import ast
from mloc.frontend.parse import parse
from mloc.ir.graph import ProgramGraph
from mloc.ir.lower import lower
from mloc.ir.payloads import ResolvedProgram
from mloc.passes.dataflow import infer_dataflow
from mloc.passes.hierarchy import HierarchyFacts, check_hierarchy
from mloc.passes.plan import Plan, Sizes, plan_program
from mloc.passes.resolve import resolve
from mloc.passes.support import cannot_run_yet, unsupported
from mloc.passes.verify_plan import verify_plan
from mloc.source import SourceFile


class InternalError(Exception):
    """A broken compiler invariant: a bug in mloc."""


@dataclass(frozen=True)
class Unit:
    """Everything known about one file so far, and where its generated code will live.

    `out_dir` is the one option: the folder `train.py` is written to (emit locates the
    program's directory relative to it); None means beside the `.mlo` file.
    """

    source: SourceFile
    out_dir: Path | None = None
    ast: ast.Module | None = None
    resolved: ResolvedProgram | None = None
    graph: ProgramGraph | None = None
    hierarchy: HierarchyFacts | None = None
    sizes: Sizes | None = None            # trace: parameters, batch, memory, aten ops per problem
    plan: Plan | None = None              # plan: methods, modes, memory, schedule
    generated: str | None = None          # emit: the text of train.py
    diagnostics: tuple[Diagnostic, ...] = ()
    timings: tuple[tuple[str, float], ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)


@dataclass(frozen=True)
class Pass:
    """One named stage. `check` passes collect every independent error; `compile` passes
    run only on a unit without errors. `dump` is what `--print-after NAME` prints."""

    name: ClassVar[str]
    summary: ClassVar[str]
    stage: ClassVar[str] = "check"

    def ready(self, unit: Unit) -> bool:
        return True

    def run(self, unit: Unit, diags: Diagnostics) -> Unit:
        raise NotImplementedError

    def dump(self, unit: Unit) -> str | None:
        if unit.graph is None:
            return None
        from mloc.ir.printer import dump_text
        return dump_text(unit.graph)


@dataclass(frozen=True)
class Parse(Pass):
    name = "parse"
    summary = "text -> AST (syntax errors)"

    def run(self, unit, diags):
        try:
            return replace(unit, ast=parse(unit.source))
        except DiagnosticError as err:
            diags.extend(err.diagnostics)
            return unit

    def dump(self, unit):
        if unit.ast is None:
            return None
        from mloc.frontend.printer import dump_ast
        return dump_ast(unit.ast)


@dataclass(frozen=True)
class Resolve(Pass):
    name = "resolve"
    summary = "names, imports, fields, built-in calls and their arguments"

    def ready(self, unit):
        return unit.ast is not None

    def run(self, unit, diags):
        return replace(unit, resolved=resolve(unit.ast, unit.source, diags))

    def dump(self, unit):
        if unit.resolved is None:
            return None
        return "\n".join(f"problem {p.name}" for p in unit.resolved.problems)


@dataclass(frozen=True)
class Lower(Pass):
    name = "lower"
    summary = "resolved problems and edges -> program graph"

    def ready(self, unit):
        return unit.resolved is not None

    def run(self, unit, diags):
        return replace(unit, graph=lower(unit.resolved))


@dataclass(frozen=True)
class CheckHierarchy(Pass):
    name = "hierarchy"
    summary = "cycles, orphans, disconnected problems, chains"

    def ready(self, unit):
        return unit.resolved is not None

    def run(self, unit, diags):
        return replace(unit, hierarchy=check_hierarchy(unit.resolved, diags))


@dataclass(frozen=True)
class Dataflow(Pass):
    name = "dataflow"
    summary = "dataflow edges inferred from losses, checked against the hierarchy"

    def ready(self, unit):
        return unit.graph is not None and unit.hierarchy is not None and unit.hierarchy.acyclic

    def run(self, unit, diags):
        graph = copy_graph(unit.graph)      # infer_dataflow adds edges to the graph it is given
        infer_dataflow(graph, unit.resolved, unit.hierarchy.uncertain, diags)
        return replace(unit, graph=graph)


@dataclass(frozen=True)
class Runnable(Pass):
    name = "runnable"
    summary = "constructs that check but cannot run yet, as warnings (W103)"

    def ready(self, unit):
        return unit.ok and unit.graph is not None

    def run(self, unit, diags):
        diags.extend(cannot_run_yet(unit.graph))
        return unit


@dataclass(frozen=True)
class Trace(Pass):
    name = "trace"
    summary = "run the user's code on the meta device: real dataflow, sizes (imports torch)"
    stage = "compile"
    compiled: bool = True      # also the sizes as a compiled step holds them (not needed under --compile off)

    def ready(self, unit):
        return unit.ok and unit.graph is not None

    def run(self, unit, diags):
        from mloc.passes.trace import trace_program   # imports torch and the user's code
        sizes, found = trace_program(unit.graph, self.compiled)
        diags.extend(found)
        return replace(unit, sizes=sizes)

    def dump(self, unit):
        from mloc.passes.trace import describe_sizes
        return describe_sizes(unit.sizes) if unit.sizes is not None else None


@dataclass(frozen=True)
class CheckSupport(Pass):
    name = "support"
    summary = "constructs checked but not executable yet (E704)"
    stage = "compile"

    def ready(self, unit):
        return unit.ok and unit.graph is not None

    def run(self, unit, diags):
        diags.extend(unsupported(unit.graph))
        return unit


@dataclass(frozen=True)
class PlanProgram(Pass):
    name = "plan"
    summary = "methods, modes, memory and the outer step's schedule"
    stage = "compile"
    compile: str = "auto"       # `--compile` (`mloc.passes.plan.plan_program`)

    def ready(self, unit):
        return unit.ok and unit.graph is not None

    def run(self, unit, diags):
        return replace(unit, plan=plan_program(unit.graph, unit.sizes, self.compile))

    def dump(self, unit):
        from mloc.passes.plan import plan_table
        return plan_table(unit.plan) if unit.plan is not None else None


CHECKS: tuple[Pass, ...] = (Parse(), Resolve(), Lower(), CheckHierarchy(), Dataflow(), Runnable())


def copy_graph(g: ProgramGraph) -> ProgramGraph:
    """A new graph with the same problems and edges (payloads are frozen, so shared)."""
    out = ProgramGraph(g.info)
    for p in g.problems():
        out.add_problem(p)
    for e in g.hierarchy_edges():
        out.add_hierarchy(e)
    for d in g.dataflow_edges():
        out.add_dataflow(d)
    return out


def verify(unit: Unit, after: str) -> None:
    """The graph's invariants after every pass, and the plan's once there is one
    (:mod:`mloc.passes.verify_plan`); a broken one is :class:`InternalError`."""
    problems = unit.graph.verify() if unit.graph is not None else []
    if not problems and unit.plan is not None:
        problems = verify_plan(unit.plan, unit.graph)
    if problems:
        raise InternalError(f"after pass `{after}`: " + "; ".join(problems))


Observer = Callable[[Pass, Unit], None]


def run_passes(unit: Unit, passes: Sequence[Pass], *, until: str | None = None,
               observer: Observer | None = None) -> Unit:
    """Run `passes` in order on `unit` (up to and including the one named `until`);
    `observer(pass, unit)` sees the result of each pass that ran."""
    timings = list(unit.timings)
    for p in passes:
        if p.ready(unit):
            diags = Diagnostics()
            t0 = time.perf_counter()
            after = p.run(unit, diags)
            timings.append((p.name, time.perf_counter() - t0))
            unit = replace(after, diagnostics=_merged(unit.diagnostics, diags, sort=p.stage == "check"),
                           timings=tuple(timings))
            verify(unit, p.name)
            if observer is not None:
                observer(p, unit)
        if p.name == until:
            break
    return unit


def _merged(old: tuple[Diagnostic, ...], new: Diagnostics, *, sort: bool) -> tuple[Diagnostic, ...]:
    items = old + tuple(d for d in new.items if d not in old)
    return tuple(sorted(items, key=Diagnostic.sort_key)) if sort else items


def compile_source(src: SourceFile, *, until: str | None = None, observer: Observer | None = None) -> Unit:
    """Check a source: the `CHECKS` passes (up to and including `until`). No torch, no user code."""
    return run_passes(Unit(src), CHECKS, until=until, observer=observer)


def compile_file(path: str, **kw) -> Unit:
    """Read and check a file (OSError / UnicodeDecodeError propagate for the CLI to report)."""
    return compile_source(SourceFile.read(path), **kw)
