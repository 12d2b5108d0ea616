"""The wheel carries the grammar: an installed mloc parses without the source tree.
And the package's layering: imports go downward only, and only the runtime and the loader
may import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROGRAM = """program p
import os as lib
problem a { module = lib.getcwd() data = lib.getcwd() loss = lib.sep(a, batch) optimizer = sgd(lr=0.1) }
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("mloc-*.whl")
    return whl


def test_wheel_contains_the_grammar(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "mloc/_grammar/mloc.lark" in names
    packaged = zipfile.ZipFile(wheel).read("mloc/_grammar/mloc.lark").decode()
    assert packaged == (ROOT / "grammar" / "mloc.lark").read_text()


def test_installed_wheel_parses_without_the_source_tree(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (tmp_path / "p.mlo").write_text(PROGRAM)
    code = (f"import sys; sys.path.insert(0, {str(site)!r})\n"
            "import mloc, mloc.frontend.grammar as g\n"
            f"assert mloc.__file__.startswith({str(site)!r}), mloc.__file__\n"
            "assert '_grammar' in str(g.grammar_path()), g.grammar_path()\n"
            "from mloc.cli import main\n"
            "raise SystemExit(main(['check', 'p.mlo']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- layering ---------------------------------------------------------------------------

LAYERS = ["source", "env", "diagnostics", "frontend", "lang", "builtins", "ir", "runtime", "passes", "codegen",
          "api", "cli"]
TORCH_ALLOWED = {"runtime"}   # everything else reaches torch only through mloc.runtime
RUNTIME_SHARES = {"mloc.ir.composition", "mloc.lang.vocabulary"}
"""Torch-free facts the runtime and the compiler share (one home each): how an upper's
hypergradient is composed, and the names of the semantics."""


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT / "mloc")
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 0 else ""


@pytest.mark.parametrize("path", sorted((ROOT / "mloc").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_downward_only(path):
    pkg = _package_of(path)
    if pkg not in LAYERS:
        return
    rank = LAYERS.index(pkg)
    for name in _imports(path):
        if name.startswith("mloc."):
            target = name.split(".")[1]
            if target in LAYERS:
                assert LAYERS.index(target) <= rank, f"{path.name} ({pkg}) imports upward: {name}"
        if name.split(".")[0] == "torch":
            assert pkg in TORCH_ALLOWED, f"{path} imports torch; only {sorted(TORCH_ALLOWED)} may"
        if pkg == "runtime" and name.startswith("mloc."):
            assert name.startswith("mloc.runtime") or name in RUNTIME_SHARES, \
                f"{path}: the runtime imports only itself and {sorted(RUNTIME_SHARES)}, not {name}"


def test_the_runtime_needs_no_compiler_dependency():
    """What generated code imports (mloc.runtime, with the torch-free facts it shares with
    the compiler) pulls in neither the parser (lark) nor the graph library (networkx)."""
    import subprocess
    import sys

    code = ("import sys, mloc.runtime, mloc.runtime.engine, mloc.runtime.launch; "
            "print(sorted(m for m in ('lark', 'networkx', 'mloc.passes', 'mloc.codegen') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
