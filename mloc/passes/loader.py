"""Load a program's Python modules and evaluate the calls a `.mlo` file writes.

This is where mloc starts executing user code (`compile`, `run`, `hypergrad`; never
`check` or `graph`). Imports are resolved beside the `.mlo` file first, then on sys.path,
exactly as the checker found them.
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from mloc.frontend import ast
from mloc.ir.payloads import ProgramInfo


@contextmanager
def program_path(directory: Path):
    """Put the program's directory first on sys.path while its modules are imported (the
    modules it has are imported from it even if another program's ran before)."""
    from mloc.runtime.base.user_modules import forget_shadowed

    entry = str(directory)
    sys.path.insert(0, entry)
    forget_shadowed(directory)
    try:
        yield
    finally:
        if sys.path and sys.path[0] == entry:
            sys.path.pop(0)


def import_modules(info: ProgramInfo) -> dict[str, ModuleType]:
    """Import every module the program names; returns {bound name: module}."""
    directory = Path(info.source_path).resolve().parent
    with program_path(directory):
        return {imp.bound: importlib.import_module(imp.module) for imp in info.imports}


def evaluate(value: ast.Value, namespace: dict[str, object]):
    """The Python value of a literal, name or call; names are looked up in `namespace`
    (import bindings, problems' modules, `batch`), dotted names by attribute access."""
    match value:
        case ast.Number() | ast.String() | ast.Bool():
            return value.value
        case ast.ListValue():
            return [evaluate(v, namespace) for v in value.items]
        case ast.TupleValue():
            return tuple(evaluate(v, namespace) for v in value.items)
        case ast.Name():
            return _lookup(value, namespace)
        case ast.Call():
            fn = _lookup(value.func, namespace)
            args = [evaluate(a.value, namespace) for a in value.args if a.keyword is None]
            kwargs = {a.keyword.name: evaluate(a.value, namespace) for a in value.args if a.keyword}
            return fn(*args, **kwargs)
    raise TypeError(f"cannot evaluate {type(value).__name__}")


def _lookup(name: ast.Name, namespace: dict[str, object]):
    if name.dotted == "None":
        return None
    for k in range(len(name.parts), 0, -1):
        head = ".".join(name.parts[:k])
        if head in namespace:
            obj = namespace[head]
            for part in name.parts[k:]:
                obj = getattr(obj, part)
            return obj
    raise NameError(name.dotted)
