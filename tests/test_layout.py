"""The code's shape is kept on purpose: imports go downward only, and no module, class or
function in `mloc/` outgrows the budget (400, 200 and 60 lines)."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "mloc"
LAYERS = ("source", "env", "diagnostics", "frontend", "lang", "builtins", "ir", "runtime", "passes",
          "codegen", "api", "cli_common", "cli_train", "cli", "__main__")
"""Bottom to top: a module may import its own layer and the layers before it."""

FILES = sorted(PACKAGE.rglob("*.py"))
BUDGET = {"module": 400, "class": 200, "function": 60}


def _layer(parts: tuple[str, ...]) -> str | None:
    return parts[0] if parts and parts[0] in LAYERS else None


def _imports(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_every_top_level_module_has_a_layer():
    names = {f.relative_to(PACKAGE).parts[0].removesuffix(".py") for f in FILES}
    assert names - {"__init__"} <= set(LAYERS)


@pytest.mark.parametrize("path", FILES, ids=[str(f.relative_to(PACKAGE)) for f in FILES])
def test_imports_go_downward(path):
    me = _layer(path.relative_to(PACKAGE).with_suffix("").parts)
    if me is None:      # mloc/__init__.py: the version and the public `load`
        return
    upward = []
    for line, module in _imports(ast.parse(path.read_text())):
        parts = module.split(".")
        if parts[0] != "mloc" or len(parts) < 2:
            continue
        other = _layer(tuple(parts[1:]))
        if other is not None and LAYERS.index(other) > LAYERS.index(me):
            upward.append(f"line {line}: {me} imports {module}")
    assert not upward


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
