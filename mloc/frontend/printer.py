"""A deterministic, indented dump of the AST (golden files pin it).

    Problem @5:1
      name: Ident 'classifier' @5:9
      ...

Every node shows its class and `line:col`; scalars print with repr.
"""

from __future__ import annotations

import dataclasses

from mloc.source import Span


def dump_ast(node) -> str:
    lines: list[str] = []
    _dump(node, 0, "", lines)
    return "\n".join(lines) + "\n"


def _pos(span: Span) -> str:
    (l1, c1), (l2, c2) = span.source.line_col(span.start), span.source.line_col(span.end)
    return f"@{l1}:{c1}-{l2}:{c2}"


def _dump(node, depth: int, label: str, out: list[str]) -> None:
    pad = "  " * depth
    if dataclasses.is_dataclass(node):
        fields = [f for f in dataclasses.fields(node) if f.name != "span"]
        scalars = [(f.name, getattr(node, f.name)) for f in fields
                   if not _is_tree(getattr(node, f.name))]
        head = " ".join(f"{k}={v!r}" for k, v in scalars)
        out.append(f"{pad}{label}{type(node).__name__} {_pos(node.span)}" + (f" {head}" if head else ""))
        for f in fields:
            value = getattr(node, f.name)
            if _is_tree(value):
                _dump(value, depth + 1, f"{f.name}: ", out)
    elif isinstance(node, tuple):
        out.append(f"{pad}{label}[{len(node)}]")
        for item in node:
            _dump(item, depth + 1, "", out)


def _is_tree(value) -> bool:
    if dataclasses.is_dataclass(value):
        return True
    return isinstance(value, tuple) and any(dataclasses.is_dataclass(v) for v in value)
