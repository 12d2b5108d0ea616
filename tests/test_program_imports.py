"""Two programs in one process, each with its own module of the same name beside it: each
gets its own (a module already imported from another program's directory is not reused)."""

from __future__ import annotations

import shutil
import sys

import mloc
from tests.test_run import SMALL


def _program(tmp_path, name: str, width: int):
    d = tmp_path / name
    d.mkdir()
    shutil.copy(SMALL.with_suffix(".py"), d / "small.py")
    text = SMALL.read_text().replace("lib.Net(width=8)", "lib.Net()")
    (d / "prog.mlo").write_text(text)
    src = (d / "small.py").read_text().replace("def __init__(self, width: int = 8):",
                                               f"def __init__(self, width: int = {width}):")
    (d / "small.py").write_text(src)
    return d / "prog.mlo"


def test_each_program_imports_the_module_beside_it(tmp_path):
    saved = sys.modules.pop("small", None)
    try:
        first = mloc.load(_program(tmp_path, "a", width=5))
        second = mloc.load(_program(tmp_path, "b", width=7))
        assert first.module("net").net[0].out_features == 5
        assert second.module("net").net[0].out_features == 7
        second.step()
        assert sys.modules["small"].__file__.startswith(str(tmp_path / "b"))
    finally:
        sys.modules.pop("small", None)
        if saved is not None:
            sys.modules["small"] = saved


def test_installed_and_standard_modules_are_never_forgotten(tmp_path):
    """A program directory with files named like the standard library's or an installed
    package's modules does not evict those from the process."""
    import json

    import torch

    from mloc.runtime.base.user_modules import forget_shadowed

    (tmp_path / "json.py").write_text("X = 1\n")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    assert forget_shadowed(tmp_path) == []
    assert sys.modules["json"] is json and sys.modules["torch"] is torch
