"""Find the user's Python modules and their top-level names without running them.

`mloc check` must not execute user code, so an import is resolved by looking for files
(`name.py` or `name/__init__.py`) beside the `.mlo` file first, then on `sys.path`, and a
module's names are read with Python's own `ast` parser. A module that defines names
dynamically (`from x import *`, a module-level `__getattr__`) is marked open, and then
attribute checks are skipped rather than guessed.

A module Python cannot parse carries the place its parser stopped (`ParseFailure`): an
import of it would raise `SyntaxError` (or, for one that exhausts the parser's stack or
memory, `RecursionError` or `MemoryError`), so `mloc check` reports it (E109) rather than
passing a program that cannot start; its names are unknown, so it is open as well.
"""

from __future__ import annotations

import ast
import functools
import io
import sys
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class ParseFailure:
    """Where Python's parser stops in a module: `message` as Python words it, 1-based
    `line` and `col` (characters, as an editor counts them) through `end_line`/`end_col`
    (inclusive), and the module's `text` (decoded as Python decodes it) to show the line.
    `whole`: the parser gave up on the module as a whole (out of stack or memory), at no
    place of its own; then the place is the first line."""

    message: str
    line: int
    col: int
    end_line: int
    end_col: int
    text: str
    whole: bool = False


@dataclass(frozen=True)
class PyModuleInfo:
    dotted: str
    path: Path | None          # None: found but not a source file (e.g. an extension module)
    names: frozenset[str]
    open: bool                  # True when the names cannot be known statically
    broken: ParseFailure | None = None      # the module does not parse (an import raises)


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


def parse_module(path: Path) -> ast.Module | ParseFailure | None:
    """The module's syntax tree, where its parser stops, or None when it cannot be read."""
    try:
        return _parse(path, path.stat().st_mtime)
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _parse(path: Path, mtime: float) -> ast.Module | ParseFailure | None:
    """Parse as `import` does: the bytes decoded by their PEP 263 coding line or BOM
    (UTF-8 without one), then compiled; a failure of either is where Python would stop."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except SyntaxError as e:                # an unknown coding line
        return _failure(raw.decode("utf-8", "replace"), e.msg, e.lineno or 1, 1)
    except UnicodeDecodeError as e:
        before = raw[:e.start]
        line_start = before.rfind(b"\n") + 1
        return _failure(raw.decode(encoding, "replace"), f"the file is not valid {encoding}: {e.reason}",
                        before.count(b"\n") + 1, len(before[line_start:].decode(encoding, "replace")) + 1)
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as e:
        if e.lineno is None and "\0" in text:     # a NUL byte, which Python reports nowhere
            return _failure(text, e.msg, *_line_col(text, text.find("\0")))
        return _failure(text, e.msg, e.lineno or 1, e.offset or 1, e.end_lineno, e.end_offset)
    except ValueError as e:                 # a NUL byte, on some Python versions
        return _failure(text, str(e), *_line_col(text, max(text.find("\0"), 0)))
    except (RecursionError, MemoryError) as e:      # `1+1+...` 200 000 terms: its import fails too
        return replace(_failure(text, f"Python's parser cannot hold it ({type(e).__name__}: {e or 'out of memory'}): "
                                      "an expression nested or chained too deeply, or a module too large", 1, 1),
                       whole=True)


def _line_col(text: str, offset: int) -> tuple[int, int]:
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


def _failure(text: str, message: str, line: int, col: int, end_line: int | None = None,
             end_col: int | None = None) -> ParseFailure:
    """Clamp Python's place into the text: an error at the end of the file can be reported
    a line past it, and Python's end is exclusive, sometimes 0 or before the start."""
    lines = text.split("\n")
    line = min(max(line, 1), len(lines))
    col = min(max(col, 1), len(lines[line - 1]) + 1)
    if end_line is None or end_col is None or (end_line, end_col - 1) < (line, col):
        end_line, end_col = line, col + 1
    end_line = min(end_line, len(lines))
    return ParseFailure(message, line, col, end_line, max(end_col - 1, 1), text)


@functools.lru_cache(maxsize=64)
def _parse_names(path: Path, mtime: float) -> tuple[frozenset[str], bool, ParseFailure | None]:
    tree = _parse(path, mtime)
    if not isinstance(tree, ast.Module):
        return frozenset(), True, tree
    names: set[str] = set()
    is_open = False
    for node in tree.body:
        is_open |= _collect(node, names)
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    return frozenset(names), is_open, None


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
    names, is_open, broken = _parse_names(path, path.stat().st_mtime)
    return PyModuleInfo(dotted, path, names, is_open, broken)


def first_broken(info: PyModuleInfo, base: Path) -> tuple[PyModuleInfo, tuple[tuple[str, int], ...]] | None:
    """The first module that importing `info` would fail to parse, and the imports that lead
    to it: `info` itself (no imports), or one of the user's own modules (files under `base`,
    the `.mlo` file's directory) that its module-level code imports, at any depth, with the
    (file, line) of each `import` on the way. Imports inside functions run only when called,
    and installed packages are taken as they are; both are left alone."""
    seen: set[Path] = set()

    def visit(mod: PyModuleInfo, via: tuple[tuple[str, int], ...]):
        if mod.broken is not None:
            return mod, via
        if mod.path is None or mod.path in seen:
            return None
        seen.add(mod.path)
        tree = parse_module(mod.path)
        if not isinstance(tree, ast.Module):
            return None
        for dotted, line in _module_imports(tree, mod):
            dep = _find_in(dotted, base)       # first on the path `mloc run` imports with
            if dep is not None:
                found = visit(dep, (*via, (str(mod.path), line)))
                if found is not None:
                    return found
        return None

    return visit(info, ())


def _module_imports(tree: ast.Module, mod: PyModuleInfo):
    """(dotted module, line) of each import that runs when the module is imported: at module
    level and in its top-level `if`/`try`/`with` blocks and class bodies, not in functions.
    `from a import b` also yields `a.b` (it may be a submodule); relative imports are made
    absolute from the module's package."""
    package = mod.dotted if mod.path is not None and mod.path.name == "__init__.py" else mod.dotted.rpartition(".")[0]
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".") if package else []
            if node.level:
                parts = parts[:len(parts) - (node.level - 1)] if node.level - 1 <= len(parts) else []
                head = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                head = node.module or ""
            if head:
                yield head, node.lineno
            yield from ((f"{head}.{a.name}" if head else a.name, node.lineno) for a in node.names if a.name != "*")
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.ExceptHandler)))
