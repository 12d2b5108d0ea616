"""Lay out generated lines within `WIDTH` columns, the way a person wraps Python by hand.

A line of code that does not fit is split inside its last outermost bracket pair (a call,
tuple, list or dict): the opening bracket ends the first line, which keeps the line's
comment; the items follow on lines indented four more, packed to the width (or one per
line); the closing bracket and what follows it end the last item's line. An item too long
for a line of its own is split the same way. Splitting only ever happens inside brackets,
so the code means what the one line meant::

    optimizer=lambda lr: shampoo(lr=lr, beta2=1.0, momentum=0.9, ..., graft_beta2=0.999),
->
    optimizer=lambda lr: shampoo(
        lr=lr, beta2=1.0, momentum=0.9, nesterov=True, epsilon=1e-06, weight_decay=0.0,
        ..., graft_beta2=0.999),

A source location (`# prog.mlo:12`) stays on the first line of its statement, where a
traceback shows it; another comment too long for its line moves above the statement, as does
one the head line has no room for. Comment and docstring text wraps at word boundaries.
What has no room to break (a line without brackets, one long word) is left as it is.
"""

from __future__ import annotations

import re
import textwrap

WIDTH = 100
INDENT = "    "
_OPENERS, _CLOSERS = "([{", ")]}"
_LOCATION = re.compile(r"# [^\s:]+\.mlo:\d+")


def fit(line: str, width: int = WIDTH) -> list[str]:
    """One generated line (code with an optional trailing comment, or a comment) as lines
    within `width`."""
    if len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip())]
    code, comment = _comment(line.strip())
    if not code:
        return prose(indent + comment, width)
    split = _split(code) if len(indent + code) > width or _LOCATION.match(comment) else None
    if split is not None:
        head, items, tail = split
        wrapped = call(indent, head, items, tail, comment, width=width)
        if len(wrapped[0]) <= width or not comment:
            return wrapped
    if not comment:
        return [line]
    return prose(indent + comment, width) + fit(indent + code, width)


def call(indent: str, head: str, items: list[str], tail: str = "", comment: str = "",
         one_per_line: bool = False, width: int = WIDTH) -> list[str]:
    """`head` (which ends with an opening bracket), the comma-separated `items`, then `tail`
    (the closing bracket and what follows it) and the comment: on one line when it fits
    (and not `one_per_line`), else with the items on hanging lines below the head."""
    note = f"  {comment}" if comment else ""
    flat = f"{indent}{head}{', '.join(items)}{tail}{note}"
    if len(flat) <= width and not one_per_line:
        return [flat]
    pieces = [item + "," for item in items[:-1]] + [items[-1] + tail]
    return [f"{indent}{head}{note}"] + _pack(pieces, indent + INDENT, width, one_per_line)


def prose(line: str, width: int = WIDTH) -> list[str]:
    """A line of text (a docstring's, or a comment: `# ...`) wrapped at word boundaries;
    continuation lines keep its indentation (and `# `)."""
    if len(line) <= width:
        return [line]
    text = line.lstrip()
    prefix = line[:len(line) - len(text)]
    if text.startswith("# "):
        prefix, text = prefix + "# ", text[2:]
    return textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=prefix,
                         break_long_words=False, break_on_hyphens=False) or [line]


def _pack(pieces: list[str], indent: str, width: int, one_per_line: bool) -> list[str]:
    """Lines at `indent` holding `pieces` in order, as many to a line as fit (one with
    `one_per_line`); a piece too long for its own line is split, and stands alone."""
    lines: list[str] = []
    current, alone = "", False
    for piece in pieces:
        if current and not one_per_line and not alone and len(current) + 1 + len(piece) <= width:
            current += " " + piece
            continue
        if current:
            lines.append(current)
        sub = fit(indent + piece, width)
        lines += sub[:-1]
        current, alone = sub[-1], len(sub) > 1
    return lines + [current]


def _comment(code: str) -> tuple[str, str]:
    """(code, comment) of one stripped line; the comment keeps its `#`."""
    at = _scan(code)[1]
    return code[:at].rstrip(), code[at:]


def _split(code: str) -> tuple[str, list[str], str] | None:
    """(head through the opening bracket, the items, closing bracket and the rest) of the last
    outermost bracket pair with something inside; None when there is none."""
    marks, _ = _scan(code)
    stack: list[int] = []
    pair = None
    for at, char in marks:
        if char in _OPENERS:
            stack.append(at)
        elif char in _CLOSERS and stack:
            start = stack.pop()
            if not stack and code[start + 1:at].strip():
                pair = (start, at)
    if pair is None:
        return None
    start, end = pair
    depth, bounds = 0, [start]
    for at, char in marks:
        if start <= at < end:
            depth += (char in _OPENERS) - (char in _CLOSERS)
            if char == "," and depth == 1:
                bounds.append(at)
    bounds.append(end)
    items = [code[a + 1:b].strip() for a, b in zip(bounds, bounds[1:])]
    if not items[-1]:               # a trailing comma: kept, as `('a',)` needs it
        items = items[:-2] + [items[-2] + ","]
    return code[:start + 1], items, code[end:]


def _scan(code: str) -> tuple[list[tuple[int, str]], int]:
    """(position and character of every bracket and comma outside strings, where the comment
    starts: `len(code)` when there is none)."""
    marks, i = [], 0
    while i < len(code):
        char = code[i]
        if char in "'\"":
            quote = code[i:i + 3] if code[i:i + 3] in ('"""', "'''") else char
            i += len(quote)
            while i < len(code) and not code.startswith(quote, i):
                i += 2 if code[i] == "\\" else 1
            i += len(quote)
            continue
        if char == "#":
            return marks, i
        if char in _OPENERS + _CLOSERS + ",":
            marks.append((i, char))
        i += 1
    return marks, len(code)
