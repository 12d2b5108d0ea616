"""The whole compile, as one list of named passes, from a `.mlo` file to generated Python.

    parse -> resolve -> lower -> hierarchy -> dataflow     the checks (`mloc check`),
          -> runnable                                      W103 for what cannot run yet
          -> trace -> support -> plan -> emit              user code on the meta device,
                                                           E704 gate, planner, train.py text

`--set` overrides are spliced into the text together before the pipeline runs, which checks
the result once (`mloc.codegen.overrides`); `emit` records them in train.py (its
declaration's `overrides`). `load_generated` registers the generated text with `linecache`,
so a traceback through generated code shows its real lines (as torch.fx does for its
generated code).
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mloc.codegen.emit import generate
from mloc.codegen.overrides import Applied, apply_all
from mloc.diagnostics import Diagnostic
from mloc.passes.pipeline import CHECKS, CheckSupport, Observer, Pass, PlanProgram, Trace, Unit, run_passes
from mloc.passes.plan import Plan, Sizes
from mloc.source import SourceFile

if TYPE_CHECKING:
    from mloc.runtime.run.declaration import Declaration


@dataclass(frozen=True)
class Emit(Pass):
    """`overrides`: the `--set`s spliced into the source, recorded in train.py."""

    name = "emit"
    summary = "the plan -> train.py text (deterministic, with `# prog.mlo:LINE` comments)"
    stage = "compile"
    overrides: tuple[str, ...] = ()

    def ready(self, unit):
        return unit.ok and unit.plan is not None

    def run(self, unit, diags):
        out = unit.out_dir if unit.out_dir is not None else Path(unit.source.path).resolve().parent
        return replace(unit, generated=generate(unit.graph, unit.plan, out, unit.sizes, self.overrides))

    def dump(self, unit):
        return unit.generated


PIPELINE: tuple[Pass, ...] = (*CHECKS, Trace(), CheckSupport(), PlanProgram(), Emit())
PASSES: dict[str, Pass] = {p.name: p for p in PIPELINE}


@dataclass(frozen=True)
class Compiled:
    """The result of the whole pipeline; `source` is the generated train.py (None on errors);
    `overrides` the `--set`s applied, in the order they were (as train.py's `overrides`)."""

    unit: Unit
    overrides: tuple[str, ...] = ()

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.unit.diagnostics

    @property
    def plan(self) -> Plan | None:
        return self.unit.plan

    @property
    def sizes(self) -> Sizes | None:
        return self.unit.sizes

    @property
    def source(self) -> str | None:
        return self.unit.generated

    @property
    def ok(self) -> bool:
        return self.unit.ok and self.unit.generated is not None


def with_overrides(path: str, overrides: tuple[str, ...] = ()) -> Applied:
    """The file's text with every `--set` spliced in, all together (OverrideError if one
    names nothing; OSError/UnicodeDecodeError propagate); nothing is checked yet."""
    return apply_all(SourceFile.read(path), overrides)


def compile_program(path: str, overrides: tuple[str, ...] = (), out_dir: Path | None = None, *,
                    observer: Observer | None = None, compile: str = "auto") -> Compiled:
    """Run `PIPELINE` once on the file with all its `overrides` applied; `out_dir` is where
    train.py will live (default: beside the file); `observer(pass, unit)` sees each pass's
    result. Diagnostics pointing into an override's text carry a note naming its `--set`.
    `compile`: the run's `--compile`, which the plan's memory budget reads (`plan_program`)."""
    applied = with_overrides(path, overrides)
    recorded = tuple(str(o) for o in applied.overrides)
    unit = Unit(applied.source, out_dir=Path(out_dir) if out_dir is not None else None)
    chosen = {PlanProgram: PlanProgram(compile=compile), Trace: Trace(compiled=compile != "off")}
    passes = tuple(chosen.get(type(p), p) for p in PIPELINE[:-1])
    unit = run_passes(unit, (*passes, Emit(recorded)), observer=observer)
    return Compiled(replace(unit, diagnostics=applied.annotate(unit.diagnostics)), recorded)


def load_generated(source: str, filename: str) -> Declaration:
    """Execute generated code as a module (tracebacks show its lines): the program it
    declares."""
    from mloc.runtime.run.declaration import declared
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    namespace = {"__name__": "mloc_generated", "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return declared(namespace)
