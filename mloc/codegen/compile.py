"""From a `.mlo` file to generated Python: check, trace the real dataflow, plan, emit, load.

    text --(--set overrides)--> frontend pipeline --> dataflow (user code, meta device)
         --> plan --> train.py text --> (optionally) exec'd as a module

`load_generated` registers the generated text with `linecache`, so a traceback through
generated code shows its real lines (as torch.fx does for its generated code).
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, replace
from pathlib import Path

from mloc.codegen.emit import generate
from mloc.codegen.overrides import Override, apply
from mloc.diagnostics import Diagnostic
from mloc.passes.pipeline import Unit, compile_source
from mloc.passes.plan import Plan, Sizes, plan_program
from mloc.source import SourceFile


@dataclass(frozen=True)
class Compiled:
    unit: Unit
    plan: Plan | None = None
    sizes: Sizes | None = None
    source: str | None = None

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.unit.diagnostics

    @property
    def ok(self) -> bool:
        return self.unit.ok and self.source is not None


def check_with_overrides(path: str, overrides: tuple[str, ...] = ()) -> Unit:
    """The frontend pipeline on the file with every `--set` applied (OverrideError if one
    names nothing; OSError/UnicodeDecodeError propagate)."""
    src = SourceFile.read(path)
    unit = compile_source(src)
    for text in overrides:
        if not unit.ok or unit.ast is None:
            return unit
        changed = apply(unit.source.text, unit.ast, Override.parse(text))
        unit = compile_source(SourceFile(path, changed))
    return unit


def compile_program(path: str, overrides: tuple[str, ...] = (), out_dir: Path | None = None,
                    trace: bool = True) -> Compiled:
    unit = check_with_overrides(path, overrides)
    if not unit.ok:
        return Compiled(unit)
    sizes = None
    if trace:
        from mloc.passes.trace import trace_program   # imports torch and the user's code
        sizes, diags = trace_program(unit.graph)
        if diags:
            return Compiled(replace(unit, diagnostics=unit.diagnostics + tuple(diags)))
    from mloc.passes.support import unsupported
    blockers = unsupported(unit.graph)
    if blockers:
        return Compiled(replace(unit, diagnostics=unit.diagnostics + tuple(blockers)))
    plan = plan_program(unit.graph, sizes)
    out = Path(out_dir) if out_dir is not None else Path(path).resolve().parent
    return Compiled(unit, plan, sizes, generate(unit.graph, plan, out, sizes))


def load_generated(source: str, filename: str) -> dict:
    """Execute generated code as a module namespace; tracebacks show its lines."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    namespace = {"__name__": "mloc_generated", "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return namespace
