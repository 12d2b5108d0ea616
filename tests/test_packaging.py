"""The wheel carries the grammar: an installed mloc parses without the source tree.
And the package's layering: imports go downward only, and only the runtime and the loader
may import torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import sysconfig
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


# --- metadata, license, README, examples ---------------------------------------------------

def _metadata(wheel: Path) -> str:
    name = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    return zipfile.ZipFile(wheel).read(name).decode()


def test_wheel_metadata_names_license_authors_and_urls(wheel):
    meta = _metadata(wheel)
    assert "License-Expression: Apache-2.0" in meta
    assert "Author-email: " in meta
    urls = [line.split(", ", 1)[1] for line in meta.splitlines() if line.startswith("Project-URL: ")]
    assert {line.split(":")[1].split(",")[0].strip() for line in meta.splitlines()
            if line.startswith("Project-URL: ")} >= {"Homepage", "Repository", "Issues"}
    assert urls and all(u.startswith("https://") for u in urls), urls


def test_license_is_the_apache_2_text_and_ships_in_the_wheel(wheel):
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.split()) > 1500   # the whole text
    names = zipfile.ZipFile(wheel).namelist()
    (packaged,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert zipfile.ZipFile(wheel).read(packaged).decode() == text


_MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"")


def test_readme_links_work_on_the_package_index():
    """PyPI renders the README without the repository beside it: a relative link or image
    there is broken. Links are absolute https URLs (paths are written as `code`)."""
    text = (ROOT / "README.md").read_text()
    links = [a or b for a, b in _MD_LINK.findall(text)]
    relative = [u for u in links if not u.startswith(("https://", "http://", "#", "mailto:"))]
    assert relative == [], (f"README.md links {relative}, which break on the package index: write "
                            "the path as `code`, or link the absolute URL under [project.urls] Repository")


def test_wheel_carries_the_example_programs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packaged = sorted(n.removeprefix("mloc/_programs/") for n in names if n.startswith("mloc/_programs/"))
    source = sorted(p.name for p in (ROOT / "programs").iterdir() if p.suffix in {".mlo", ".py"})
    assert packaged == source


def test_mloc_examples_after_a_non_editable_install(wheel, tmp_path):
    """`pip install` of the wheel into a fresh venv (its dependencies from this one), then
    `mloc examples DIR` from a folder with no source tree: the programs arrive and check."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]             # torch, lark, ...: not mloc (no .pth is read)
    Path(site, "deps.pth").write_text(deps + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                           "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    mloc = [str(venv / "bin" / "mloc")]
    done = subprocess.run(mloc + ["examples", "ex"], cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    copied = sorted(p.name for p in (work / "ex").iterdir())
    assert copied == sorted(p.name for p in (ROOT / "programs").iterdir() if p.suffix in {".mlo", ".py"})
    assert (work / "ex" / "hpo.mlo").read_text() == (ROOT / "programs" / "hpo.mlo").read_text()
    where = subprocess.run([str(py), "-c", "import mloc; print(mloc.__file__)"], cwd=work,
                           capture_output=True, text=True, timeout=120).stdout
    assert where.startswith(site), where               # the installed copy, not the checkout
    checked = subprocess.run(mloc + ["check", "ex/hpo.mlo", "ex/maml.mlo"], cwd=work,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    again = subprocess.run(mloc + ["examples", "ex"], cwd=work, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr


# --- layering ---------------------------------------------------------------------------

LAYERS = ["source", "env", "shared", "diagnostics", "frontend", "lang", "builtins", "ir", "runtime", "passes",
          "codegen", "api", "cli"]
TORCH_ALLOWED = {"runtime"}   # everything else reaches torch only through mloc.runtime
COMPILER = ("mloc.source", "mloc.env", "mloc.diagnostics", "mloc.frontend", "mloc.lang", "mloc.builtins",
            "mloc.ir", "mloc.passes", "mloc.codegen", "mloc.api", "mloc.cli")
"""What the runtime must never load: everything of mloc but the runtime and `mloc.shared`
(torch-free facts both sides read, one home each; it imports nothing else of mloc)."""


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
        if pkg in ("runtime", "shared") and name.startswith("mloc."):
            allowed = ("mloc.runtime", "mloc.shared") if pkg == "runtime" else ("mloc.shared",)
            assert name.startswith(allowed), f"{path}: {pkg} imports {name}; it may import only {allowed}"


_LOADED = """
import runpy, sys
COMPILER = {compiler!r}
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("lark", "networkx")
                  or any(m == p or m.startswith(p + ".") for p in COMPILER))
import mloc.runtime
assert loaded() == [], loaded()
sys.argv = ["train.py", "--steps", "1", "--out", {out!r}, "--quiet", "--device", "cpu"]
try:
    runpy.run_path({train!r}, run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
print(loaded())
"""


@pytest.mark.parametrize("name", ["data_reweighting", "interlock"])
def test_the_runtime_loads_nothing_of_the_compiler(name, tmp_path):
    """In a fresh process, `import mloc.runtime`, and then a compiled train.py trained for
    one step (with its evaluations), leave no module of the compiler in `sys.modules`, nor
    the parser (lark) or the graph library (networkx): generated code and the runtime read
    their types from the runtime and `mloc.shared` only."""
    from mloc.codegen.compile import compile_program
    from tests.conftest import PROGRAMS

    c = compile_program(str(PROGRAMS / f"{name}.mlo"), out_dir=tmp_path)
    assert c.ok, c.diagnostics
    (tmp_path / "train.py").write_text(c.source)
    code = _LOADED.format(compiler=COMPILER, out=str(tmp_path / "run"), train=str(tmp_path / "train.py"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the runtime's subpackages ------------------------------------------------------------

RUNTIME_LAYERS = ["files", "base", "optim", "methods", "grad", "compiled", "program", "run", "processes"]
"""mloc/runtime/'s subpackages, bottom to top (docs/architecture.md says what each holds): a
module imports only from its own subpackage and those before it, at module level or inside a
function; none imports the package `mloc.runtime` itself (its names come from their
subpackages). The modules of `files`, the bottom, import no torch of their own."""


def _runtime_wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """`module -> import` for each import of a runtime module that goes up the order, or
    into the package `mloc.runtime` itself."""
    found = []
    for name, deps in sorted(graph.items()):
        if not name.startswith("mloc.runtime."):
            continue
        layer = RUNTIME_LAYERS.index(name.split(".")[2])
        for dep in sorted(deps):
            if dep == "mloc.runtime":
                found.append(f"{name} -> mloc.runtime (import from the subpackage that defines the name)")
            elif dep.startswith("mloc.runtime.") and RUNTIME_LAYERS.index(dep.split(".")[2]) > layer:
                found.append(f"{name} -> {dep}")
    return found


def test_the_runtime_is_its_subpackages():
    """No flat module beside them: a new module goes into the subpackage of its concern."""
    runtime = ROOT / "mloc" / "runtime"
    assert sorted(p.name for p in runtime.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in runtime.iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(RUNTIME_LAYERS)


def _runtime_graph() -> dict[str, set[str]]:
    """Each module of mloc/runtime and the runtime modules it imports, anywhere in it
    (tests/test_import_cycles.py's graph of mloc, cut to the runtime)."""
    from tests.test_import_cycles import import_graph
    inside = lambda m: m == "mloc.runtime" or m.startswith("mloc.runtime.")    # noqa: E731
    return {m: {t for t in out if inside(t)} for m, out in import_graph().items() if inside(m)}


def test_runtime_subpackages_import_one_way():
    assert _runtime_wrong_way(_runtime_graph()) == []


def test_the_runtime_order_check_can_fail():
    graph = {"mloc.runtime.files.a": {"mloc.runtime.grad.b"}, "mloc.runtime.grad.b": {"mloc.runtime.files.a"},
             "mloc.runtime.base.c": {"mloc.runtime"}}
    assert _runtime_wrong_way(graph) == ["mloc.runtime.base.c -> mloc.runtime (import from the subpackage "
                                         "that defines the name)", "mloc.runtime.files.a -> mloc.runtime.grad.b"]


@pytest.mark.parametrize("path", sorted((ROOT / "mloc" / "runtime" / "files").glob("*.py")), ids=lambda p: p.name)
def test_the_runtime_files_need_no_torch(path):
    top = [n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n for n in names if n.split(".")[0] == "torch"}, f"{path} imports torch at module level"
