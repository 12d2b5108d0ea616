"""Every bad program in tests/diagnostics/ states the diagnostics it must produce.

An annotation `#! CODE@COL [CODE@COL ...]` at the end of a line says that line must get a
diagnostic with that code starting at that column. The set of (file, code, line, column)
that mloc reports must equal the annotated set exactly: nothing missing, nothing extra. A
diagnostic in a Python module the case imports (E109, a syntax error there) is annotated on
the module's line, in the module beside the case.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mloc.diagnostics import CODES
from mloc.passes.pipeline import compile_file

CORPUS = Path(__file__).parent / "diagnostics"
RUN_WARNINGS = {"W105"}   # needs the command line (--steps): tests/test_trace_diagnostics.py
CASES = sorted(CORPUS.glob("*.mlo"))
_ANNOTATION = re.compile(r"#!\s*(.*)$")
_ITEM = re.compile(r"^([EW]\d{3})@(\d+)$")


def expected(path: Path) -> list[tuple[str, str, int, int]]:
    """The annotations of the case and of the corpus modules it imports."""
    imported = re.findall(r"^import (\w+)", path.read_text(encoding="utf-8"), re.M)
    return sorted(a for p in (path, *(CORPUS / f"{m}.py" for m in imported)) if p.is_file()
                  for a in _annotations(p))


def _annotations(path: Path) -> list[tuple[str, str, int, int]]:
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _ANNOTATION.search(line)
        if not m:
            continue
        for item in m.group(1).split():
            parsed = _ITEM.match(item)
            assert parsed, f"{path.name}:{lineno}: malformed annotation {item!r} (want CODE@COL)"
            out.append((path.name, parsed.group(1), lineno, int(parsed.group(2))))
    return out


def reported(path: Path) -> list[tuple[str, str, int, int]]:
    """What `mloc check` reports; for a case that imports `evallib` or `tracelib` (modules
    meant to run: the E7xx found by running the program's code), what `mloc compile` reports."""
    if re.search(r"^import (evallib|tracelib)\b", path.read_text(encoding="utf-8"), re.M):
        from mloc.codegen.compile import compile_program
        unit = compile_program(str(path)).unit
    else:
        unit = compile_file(str(path))
    return sorted((Path(d.span.source.path).name, d.code, d.span.line, d.span.col) for d in unit.diagnostics)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_reports_exactly_its_annotations(path):
    want = expected(path)
    assert want, f"{path.name} has no `#!` annotation"
    assert reported(path) == want


def test_corpus_is_large_and_covers_every_static_code():
    assert len(CASES) >= 30
    seen = {code for p in CASES for _, code, _, _ in expected(p)}
    static = {c for c in CODES if c[1] in "0123456" or c.startswith("W")} - RUN_WARNINGS
    assert static - seen == set(), f"codes with no bad program: {sorted(static - seen)}"
