"""The code's shape is kept on purpose: no module, class or function in `mloc/` outgrows
the budget (400, 200 and 60 lines). (The layering is tested in test_packaging.py.)"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "mloc"
FILES = sorted(PACKAGE.rglob("*.py"))
BUDGET = {"module": 400, "class": 200, "function": 60}


def _too_big(path):
    text = path.read_text()
    found = []
    if len(text.splitlines()) > BUDGET["module"]:
        found.append(f"module: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text)):
        kind = ("class" if isinstance(node, ast.ClassDef) else
                "function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if kind and node.end_lineno - node.lineno + 1 > BUDGET[kind]:
            found.append(f"{kind} {node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines")
    return found


@pytest.mark.parametrize("path", FILES, ids=[str(f.relative_to(PACKAGE)) for f in FILES])
def test_size_budget(path):
    assert not _too_big(path)


def test_the_size_check_can_fail(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("def f():\n" + "    x = 1\n" * 70 + "\n" * 340)
    assert _too_big(big) == ["module: 411 lines", "function f (line 1): 71 lines"]
