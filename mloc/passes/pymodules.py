"""Find the user's Python modules and their top-level names without running them.

`mloc check` must not execute user code, so an import is resolved by looking for files
(`name.py` or `name/__init__.py`) beside the `.mlo` file first, then on `sys.path`, and a
module's names are read with Python's own `ast` parser. A module that defines names
dynamically (`from x import *`, a module-level `__getattr__`) is marked open, and then
attribute checks are skipped rather than guessed.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PyModuleInfo:
    dotted: str
    path: Path | None          # None: found but not a source file (e.g. an extension module)
    names: frozenset[str]
    open: bool                  # True when the names cannot be known statically


def find_module(dotted: str, base: Path) -> PyModuleInfo | None:
    """Locate `dotted` beside `base` first, then on sys.path; None when it is nowhere."""
    for root in [base, *(Path(p) if p else Path.cwd() for p in sys.path)]:
        info = _find_in(dotted, root)
        if info is not None:
            return info
    return None


def _find_in(dotted: str, root: Path) -> PyModuleInfo | None:
    parts = dotted.split(".")
    here = root.joinpath(*parts)
    try:
        for candidate in (here.with_suffix(".py"), here / "__init__.py"):
            if candidate.is_file():
                return _read(dotted, candidate)
        if here.is_dir():
            # a namespace package, or a compiled module: accept without checking names
            return PyModuleInfo(dotted, None, frozenset(), True)
        parent = here.parent
        if parent.is_dir() and any(parent.glob(parts[-1] + ".*.so")):
            return PyModuleInfo(dotted, None, frozenset(), True)
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=64)
def _parse_names(path: Path, mtime: float) -> tuple[frozenset[str], bool]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return frozenset(), True
    names: set[str] = set()
    is_open = False
    for node in tree.body:
        is_open |= _collect(node, names)
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    return frozenset(names), is_open


def _collect(node: ast.stmt, names: set[str]) -> bool:
    """Add the names `node` binds at module level; True if it makes the module open."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
        return node.name == "__getattr__"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        if any(a.name == "*" for a in node.names):
            return True
        names.update((a.asname or a.name).split(".")[0] for a in node.names)
        return False
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    for t in targets:
        names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
        # names bound in top-level control flow (try/except ImportError, if TYPE_CHECKING)
        opened = False
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                opened |= _collect(child, names)
            elif isinstance(child, ast.ExceptHandler):
                for stmt in child.body:
                    opened |= _collect(stmt, names)
        return opened
    return False


def _read(dotted: str, path: Path) -> PyModuleInfo:
    names, is_open = _parse_names(path, path.stat().st_mtime)
    return PyModuleInfo(dotted, path, names, is_open)
