"""The generated train.py reads like code a person wrote: every line mloc writes fits in 100
columns, long calls and literals wrapped with a hanging indent, long comments and docstring
text at word boundaries, and the wrapped code means what the one-line code meant."""

from __future__ import annotations

import ast
import textwrap

import pytest

from mloc.codegen import layout
from mloc.codegen.compile import compile_program
from mloc.codegen.emit import _overrides_doc
from tests.conftest import PROGRAMS, ROOT

WIDTH = 100
EXAMPLES = sorted(PROGRAMS.glob("*.mlo"))

# The one exception: the closing comment block quotes torch.fx's printout of each traced
# loss (`#     ` then torch's own line, e.g. `#         addmm = torch.ops.aten.addmm...`).
# That is torch's output, quoted as printed, not text mloc writes, so it keeps its lines.
TRACE_HEADER = "# The losses as torch.fx traced them"
QUOTED = "#     "


def too_long(source: str) -> list[str]:
    """The lines of `source` over `WIDTH`, except torch.fx's quoted printout."""
    lines = source.splitlines()
    trace = next((n for n, line in enumerate(lines) if line.startswith(TRACE_HEADER)), len(lines))
    return [f"{n + 1}: {line}" for n, line in enumerate(lines)
            if len(line) > WIDTH and not (n > trace and line.startswith(QUOTED))]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_line_mloc_writes_fits_in_100_columns(path):
    source = compile_program(str(path), out_dir=ROOT / "build" / path.stem).source
    assert source is not None
    ast.parse(source)
    assert too_long(source) == []


def test_the_check_sees_a_long_line_but_not_torch_printout():
    code = "x = 1\n" + "y = " + "1 + " * 30 + "1\n"
    traced = f"{TRACE_HEADER} at compile time:\n#         " + "a" * 120 + "\n"
    assert too_long(code) == ["2: " + code.splitlines()[1]]
    assert too_long(traced) == []
    assert len(too_long("#         " + "a" * 120)) == 1     # quoted only inside the trace block


# --- the layout itself --------------------------------------------------------------------

def same_code(line: str, lines: list[str]) -> bool:
    """Whether the wrapped lines parse to what the one line parsed to (comments aside)."""
    return ast.dump(ast.parse(line.strip())) == ast.dump(ast.parse(textwrap.dedent("\n".join(lines))))


TRICKY = [
    "x = f(" + ", ".join(f"a{i}={i}" for i in range(30)) + ")  # prog.mlo:3: a note",
    "y = g('(, [ # not a comment', " + ", ".join(f"'s{i},)'" for i in range(20)) + ", h=('one',))",
    "z = {" + ", ".join(f"'k{i}': ({i},)" for i in range(20)) + "}",
    "w = outer(inner(" + ", ".join(f"deep_argument_{i}" for i in range(12)) + "), last=[1, 2, 3])",
    "v = (" + ", ".join(f"'item_{i}'" for i in range(25)) + ",)",
]


@pytest.mark.parametrize("line", TRICKY, ids=["comment", "strings", "dict", "nested", "trailing-comma"])
def test_wrapped_code_fits_and_means_the_same(line):
    lines = layout.fit(line)
    assert len(lines) > 1 and all(len(x) <= WIDTH for x in lines)
    assert same_code(line, lines)
    if "#" in line and "'" not in line:
        assert lines[0].endswith("(  # prog.mlo:3: a note")       # the comment stays on the head


def test_a_long_note_moves_above_a_statement_that_fits_but_a_location_stays_on_it():
    line = "    p.upper_step('weight_net')  # " + "a long note " * 10
    lines = layout.fit(line)
    assert lines[-1] == "    p.upper_step('weight_net')"
    assert all(x.startswith("    # ") and len(x) <= WIDTH for x in lines[:-1])
    located = "    Edge('a', 'b', sama(eps=0.01)),  # prog.mlo:25: " + "a long note " * 6
    assert layout.fit(located) == ["    Edge(  # prog.mlo:25: " + ("a long note " * 6).strip(),
                                   "        'a', 'b', sama(eps=0.01)),"]


def test_what_has_no_room_to_break_is_left_alone():
    path = "x = '" + "a/" * 60 + "'"
    assert layout.fit(path) == [path]
    assert layout.fit("short = f(1)") == ["short = f(1)"]


def test_prose_wraps_at_words_and_keeps_indent_and_comment_marker():
    text = "    # " + " ".join(["word"] * 40)
    lines = layout.prose(text)
    assert all(x.startswith("    # word") and len(x) <= WIDTH for x in lines)
    assert " ".join(x[6:] for x in lines) == text[6:]


def test_a_long_set_stays_one_shell_word_and_the_rest_of_the_header_fits():
    value = "lib.Net(" + ", ".join(f"width_{i}={i}" for i in range(20)) + ")"
    doc = _overrides_doc("a_rather_long_program_name_for_this_check.mlo", (f"classifier.module={value}",) * 2)
    (set_line,) = {x for x in doc if x.startswith("    --set ")}
    assert value in set_line and len(set_line) > WIDTH         # the one explicit exception
    assert all(len(x) <= WIDTH for x in doc if x != set_line)
