"""The frontend pipeline, as one tuple of named passes read top to bottom.

    parse -> resolve -> lower -> hierarchy -> dataflow

Each pass is a frozen dataclass (its options would be its fields) that takes the
compilation `Unit` and returns a new one. Diagnostics are collected across passes; a pass
that cannot run on what came before is skipped, so every independent error is reported in
one run. After every pass the graph's invariants are verified: a violation is a bug in mloc
(`InternalError`), never the user's fault.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import ClassVar

from mloc.diagnostics import Diagnostic, DiagnosticError, Diagnostics
from mloc.frontend import ast
from mloc.frontend.parse import parse
from mloc.ir.graph import ProgramGraph
from mloc.ir.lower import lower
from mloc.ir.payloads import ResolvedProgram
from mloc.passes.dataflow import infer_dataflow
from mloc.passes.hierarchy import HierarchyFacts, check_hierarchy
from mloc.passes.resolve import resolve
from mloc.source import SourceFile


class InternalError(Exception):
    """A broken compiler invariant: a bug in mloc."""


@dataclass(frozen=True)
class Unit:
    """Everything known about one file so far."""

    source: SourceFile
    ast: ast.Module | None = None
    resolved: ResolvedProgram | None = None
    graph: ProgramGraph | None = None
    hierarchy: HierarchyFacts | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    timings: tuple[tuple[str, float], ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str]
    summary: ClassVar[str]

    def ready(self, unit: Unit) -> bool:
        return True

    def run(self, unit: Unit, diags: Diagnostics) -> Unit:
        raise NotImplementedError


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


@dataclass(frozen=True)
class Resolve(Pass):
    name = "resolve"
    summary = "names, imports, fields, built-in calls and their arguments"

    def ready(self, unit):
        return unit.ast is not None

    def run(self, unit, diags):
        return replace(unit, resolved=resolve(unit.ast, unit.source, diags))


@dataclass(frozen=True)
class Lower(Pass):
    name = "lower"
    summary = "resolved problems and edges -> program graph"

    def ready(self, unit):
        return unit.resolved is not None

    def run(self, unit, diags):
        return replace(unit, graph=lower(unit.resolved))


@dataclass(frozen=True)
class Hierarchy(Pass):
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
        infer_dataflow(unit.graph, unit.resolved, unit.hierarchy.uncertain, diags)
        return unit


PIPELINE: tuple[Pass, ...] = (Parse(), Resolve(), Lower(), Hierarchy(), Dataflow())
PASSES: dict[str, Pass] = {p.name: p for p in PIPELINE}


def verify(unit: Unit, after: str) -> None:
    if unit.graph is not None:
        problems = unit.graph.verify()
        if problems:
            raise InternalError(f"after pass `{after}`: " + "; ".join(problems))


def compile_source(src: SourceFile, *, until: str | None = None, observer=None) -> Unit:
    """Run the pipeline (up to and including `until`); `observer(pass, unit)` sees each result."""
    unit, diags, timings = Unit(src), Diagnostics(), []
    for p in PIPELINE:
        if p.ready(unit):
            t0 = time.perf_counter()
            unit = p.run(unit, diags)
            timings.append((p.name, time.perf_counter() - t0))
            verify(unit, p.name)
            if observer is not None:
                observer(p, unit)
        if p.name == until:
            break
    return replace(unit, diagnostics=diags.sorted(), timings=tuple(timings))


def compile_file(path: str, **kw) -> Unit:
    """Read and check a file (OSError / UnicodeDecodeError propagate for the CLI to report)."""
    return compile_source(SourceFile.read(path), **kw)
