"""The program's values as Python source: literals, names and calls, as generated code
writes them (`render_value`)."""

from __future__ import annotations

from mloc.frontend import ast


def render_value(value: ast.Value, names: dict[str, str] | None = None) -> str:
    """Python source for a literal, name or call; `names` renames problems (and `batch`)."""
    names = names or {}
    match value:
        case ast.Number():
            return value.text.replace("_", "")
        case ast.String():
            return repr(value.value)
        case ast.Bool():
            return "True" if value.value else "False"
        case ast.Name():
            return names.get(value.dotted, value.dotted)
        case ast.ListValue():
            return "[" + ", ".join(render_value(v, names) for v in value.items) + "]"
        case ast.TupleValue():
            items = [render_value(v, names) for v in value.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        case ast.Call():
            args = [(f"{a.keyword.name}=" if a.keyword else "") + render_value(a.value, names) for a in value.args]
            return f"{value.func.dotted}({', '.join(args)})"
    raise TypeError(type(value).__name__)
