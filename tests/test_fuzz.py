"""Property: mutating a valid program (deleting, duplicating, swapping tokens and lines)
never produces a traceback. Every outcome is a clean check or a list of diagnostics, each
with a registered code and a span inside the file."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mloc.cli import main
from mloc.diagnostics import CODES, render
from mloc.passes.pipeline import compile_source
from mloc.source import SourceFile
from tests.conftest import PROGRAMS

EXAMPLES = {p: p.read_text() for p in sorted(PROGRAMS.glob("*.mlo"))}
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:e-?\d+)?|\"[^\"\n]*\"|->|\S")


def _tokens(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in TOKEN.finditer(text)]


@st.composite
def mutated(draw):
    path = draw(st.sampled_from(sorted(EXAMPLES)))
    text = EXAMPLES[path]
    for _ in range(draw(st.integers(1, 3))):
        text = _mutate(draw, text)
    return path, text


def _mutate(draw, text: str) -> str:
    kind = draw(st.sampled_from(["del_line", "dup_line", "swap_lines", "del_tok", "dup_tok",
                                 "swap_toks", "insert"]))
    lines = text.split("\n")
    toks = _tokens(text)
    if kind.endswith("line") or kind == "swap_lines":
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        if kind == "del_line":
            del lines[i]
        elif kind == "dup_line":
            lines.insert(i, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if kind == "insert":
        at = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(["{", "}", "(", ")", "[", "]", ",", "=", "->", "\"", "'", "-1",
                                     "0", "1e999", "batch", "problem", "train", "é", "\t", "#"]))
        return text[:at] + junk + text[at:]
    (a0, a1), (b0, b1) = draw(st.sampled_from(toks)), draw(st.sampled_from(toks))
    if kind == "del_tok":
        return text[:a0] + text[a1:]
    if kind == "dup_tok":
        return text[:a1] + " " + text[a0:a1] + text[a1:]
    if a0 > b0:
        (a0, a1), (b0, b1) = (b0, b1), (a0, a1)
    if a1 > b0:
        return text
    return text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_never_crash(case):
    path, text = case
    unit = compile_source(SourceFile(str(path), text))
    for d in unit.diagnostics:
        assert d.code in CODES
        assert d.message and not d.message.endswith(".")
        if d.span is not None:
            assert 0 <= d.span.start <= d.span.end <= len(text)
    render(unit.diagnostics, "full")
    render(unit.diagnostics, "json")
    if unit.ok:
        assert unit.graph is not None and unit.graph.verify() == []


@settings(max_examples=40, deadline=None)
@given(mutated())
def test_mutations_through_the_cli_exit_0_or_1(tmp_path_factory, case):
    path, text = case
    target = tmp_path_factory.mktemp("fuzz") / path.name   # imports will not resolve here: E105
    target.write_text(text, encoding="utf-8")
    assert main(["check", str(target), "--color", "never", "--format", "concise"]) in (0, 1)
