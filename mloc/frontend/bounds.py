"""What the parser refuses before it builds the AST: an integer literal that does not fit in
64 bits (E006) and brackets nested deeper than :data:`MAX_NESTING` (E007).

Both are limits of the language, not of one field: without them a literal of more than
4300 digits stops Python's ``int()`` and a few hundred nested calls or lists exhaust the
stack of the recursive passes, and either was an internal error. The bounds a field puts on
its value (``unroll`` at most 10^6, a seed below 2^63) are checked later, by the field's
type (:mod:`mloc.shared.limits`, E305).
"""

from __future__ import annotations

import re

from mloc.diagnostics import Diagnostic
from mloc.source import SourceFile, Span

MAX_INT = 2**64 - 1
"""The largest magnitude of an integer literal: 64 bits, as torch and NumPy hold integers."""
MAX_NESTING = 64
"""How deep `(`, `[` and `{` may nest: far beyond any program (a block holding a call of
a list of tuples is 4), far below what the passes can walk."""

STRING_OR_COMMENT = re.compile(r'"([^"\\\n]|\\.)*"|\'([^\'\\\n]|\\.)*\'|#[^\n]*')
"""A string or a comment, where brackets and characters do not count (one home: the parser uses it too)."""


def integer(text: str, span: Span) -> int | Diagnostic:
    """The value of the integer literal `text` (digits, `_` and a sign), or E006 at `span`
    when it does not fit in 64 bits (checked on the digits first, so that no literal is
    ever too long for Python's `int()`)."""
    digits = text.replace("_", "").lstrip("+-").lstrip("0")
    if len(digits) <= len(str(MAX_INT)) and int(digits or "0") <= MAX_INT:
        return int(text.replace("_", ""))
    shown = text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(digits)} digits)"
    return Diagnostic("E006", f"the integer {shown} does not fit in 64 bits", span,
                      label=f"more than {MAX_INT} (2**64 - 1)",
                      help="integers in a program are at most 2**64 - 1 in magnitude; write a float such as "
                           "`1e30` for a large real number, and see `mloc explain E305` for the bounds of counts")


def too_deep(src: SourceFile) -> Diagnostic | None:
    """E007 at the first bracket that opens level MAX_NESTING + 1 (strings and comments
    skipped); None when the text nests no deeper than MAX_NESTING."""
    code = STRING_OR_COMMENT.sub(lambda m: " " * len(m.group(0)), src.text)
    depth = 0
    for i, ch in enumerate(code):
        if ch in "([{":
            depth += 1
            if depth > MAX_NESTING:
                return Diagnostic("E007", f"brackets are nested more than {MAX_NESTING} deep here",
                                  src.span(i, i + 1), label=f"level {MAX_NESTING + 1}",
                                  help=f"mloc reads at most {MAX_NESTING} levels of `(`, `[` and `{{`; "
                                       "build a deeply nested value in the Python module and call that")
        elif ch in ")]}":
            depth = max(depth - 1, 0)
    return None
