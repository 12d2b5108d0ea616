"""A program's own Python modules: the ones beside its `.mlo` file win over any module of
the same name an earlier program in this process imported.

Python caches modules by name in ``sys.modules``, so after ``import reweighting`` from one
program's directory, a second program with its own ``reweighting.py`` would silently get
the first one's classes and losses (a notebook that loads two programs, a test suite).
:func:`forget_shadowed` drops such entries before a program's imports run. Only user
modules are ever dropped: a cached module whose file lies in the standard library or in
an installed package (site-packages) is left alone, even if the program's directory has a
file of that name.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

_INSTALLED = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _local_names(directory: Path) -> set[str]:
    """Top-level module names ``directory`` provides (``x.py`` files and ``x/`` packages)."""
    names = set()
    for entry in directory.iterdir():
        if entry.suffix == ".py":
            names.add(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            names.add(entry.name)
    return names


def forget_shadowed(directory: str | Path) -> list[str]:
    """Drop from ``sys.modules`` every user module (and its submodules) that ``directory``
    shadows and that was loaded from elsewhere; returns the names dropped."""
    directory = Path(directory).resolve()
    try:
        local = _local_names(directory)
    except OSError:
        return []
    dropped = []
    for name in sorted(local & set(sys.modules)):
        file = getattr(sys.modules[name], "__file__", None)
        if not file:
            continue
        path = str(Path(file).resolve())
        if path.startswith(_INSTALLED) or Path(path).parent in (directory, directory / name):
            continue
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        dropped.append(name)
    return dropped


def put_first(directory: str | Path) -> Path:
    """``directory`` first on ``sys.path`` (moved there if it was further down), with the
    modules it shadows forgotten (:func:`forget_shadowed`)."""
    path = Path(directory).resolve()
    entry = str(path)
    if entry in sys.path:
        sys.path.remove(entry)
    sys.path.insert(0, entry)
    forget_shadowed(path)
    return path
