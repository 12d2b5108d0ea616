"""The whole compile, as one list of named passes, from a `.mlo` file to generated Python.

    parse -> resolve -> lower -> hierarchy -> dataflow     the checks (`mloc check`)
          -> trace -> support -> plan -> emit              user code on the meta device,
                                                           E704 gate, planner, train.py text

`--set` overrides are spliced into the text before the pipeline runs (each is checked on
the text before it). `load_generated` registers the generated text with `linecache`, so a
traceback through generated code shows its real lines (as torch.fx does for its generated
code).
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, replace
from pathlib import Path

from mloc.codegen.emit import generate
from mloc.codegen.overrides import Override, apply
from mloc.diagnostics import Diagnostic
from mloc.passes.pipeline import (CHECKS, CheckSupport, Observer, Pass, PlanProgram, Trace, Unit, compile_source,
                                  run_passes)
from mloc.passes.plan import Plan, Sizes
from mloc.source import SourceFile


@dataclass(frozen=True)
class Emit(Pass):
    name = "emit"
    summary = "the plan -> train.py text (deterministic, with `# prog.mlo:LINE` comments)"
    stage = "compile"

    def ready(self, unit):
        return unit.ok and unit.plan is not None

    def run(self, unit, diags):
        out = unit.out_dir if unit.out_dir is not None else Path(unit.source.path).resolve().parent
        return replace(unit, generated=generate(unit.graph, unit.plan, out, unit.sizes))

    def dump(self, unit):
        return unit.generated


PIPELINE: tuple[Pass, ...] = (*CHECKS, Trace(), CheckSupport(), PlanProgram(), Emit())
PASSES: dict[str, Pass] = {p.name: p for p in PIPELINE}


@dataclass(frozen=True)
class Compiled:
    """The result of the whole pipeline; `source` is the generated train.py (None on errors)."""

    unit: Unit

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


def with_overrides(path: str, overrides: tuple[str, ...] = ()) -> tuple[SourceFile, Unit | None]:
    """The file's text with every `--set` spliced in, each into a text that checks cleanly;
    or, as the second item, the checked unit of the text that did not (OverrideError if an
    override names nothing; OSError/UnicodeDecodeError propagate)."""
    src = SourceFile.read(path)
    for text in overrides:
        unit = compile_source(src)
        if not unit.ok or unit.ast is None:
            return src, unit
        src = SourceFile(path, apply(src.text, unit.ast, Override.parse(text)))
    return src, None


def compile_program(path: str, overrides: tuple[str, ...] = (), out_dir: Path | None = None, *,
                    observer: Observer | None = None) -> Compiled:
    """Run `PIPELINE` on the file (with `overrides`); `out_dir` is where train.py will live
    (default: beside the file); `observer(pass, unit)` sees each pass's result."""
    src, stopped = with_overrides(path, overrides)
    if stopped is not None:
        return Compiled(stopped)
    unit = Unit(src, out_dir=Path(out_dir) if out_dir is not None else None)
    return Compiled(run_passes(unit, PIPELINE, observer=observer))


def load_generated(source: str, filename: str) -> dict:
    """Execute generated code as a module namespace; tracebacks show its lines."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    namespace = {"__name__": "mloc_generated", "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return namespace
