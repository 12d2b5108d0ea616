"""The runtime's objects keep their privates: a leading underscore means private to the
module that defines the name. No module of `mloc/runtime` reads or writes `x._name` of an
object other than `self`/`cls` unless its own module defines `_name` (the chain step, the
meta-batch and a pipeline worker use `Program`'s public interface: `drawer`, `pipeline`,
`chain_step`, ...), nor writes another object's `__dict__`. The exceptions are torch's and
the standard library's, each named below with why there is no public spelling."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

RUNTIME = ROOT / "mloc" / "runtime"
FILES = sorted(RUNTIME.rglob("*.py"))

ALLOWED = {
    # torch's fused multi-tensor kernels (what torch.optim and GradScaler call); no public name
    "torch._foreach_*": re.compile(r"_foreach_\w+"),
    "torch._amp_foreach_non_finite_check_and_unscale_": re.compile(r"_amp_foreach_non_finite_check_and_unscale_"),
    # torch's C binding, probed for `_is_any_autocast_enabled` (read with a fallback): the
    # one-call test of every autocast region, which the public per-device calls are not
    "torch._C._is_any_autocast_enabled": re.compile(r"_C|_is_any_autocast_enabled"),
    # nn.Module's parameter dict: binding swaps the tensors in place without re-registering
    # them (as torch.func.functional_call does)
    "nn.Module._parameters": re.compile(r"_parameters"),
    # a tensor's version counter and view base: whether its value may change after a watch
    "Tensor._version, Tensor._base": re.compile(r"_version|_base"),
    # namedtuple's public API (underscored so as not to clash with field names)
    "namedtuple._replace, ._fields": re.compile(r"_replace|_fields"),
    # the standard library's exit without cleanup, for a forked child before exec
    "os._exit": re.compile(r"_exit"),
    # the standard library's one way to run the exit handlers before such an exit (a rank
    # that ends without finalization: mloc/runtime/processes/ending.py)
    "atexit._run_exitfuncs": re.compile(r"_run_exitfuncs"),
    # an aten operator's schema (which outputs alias an input, which inputs it writes): what
    # torch's own dispatch modes read to tell a new storage from a view; and forward-mode
    # AD's zero tangents, whose storage has a nominal size and no memory
    # (mloc/runtime/base/memory.py counts allocations with both)
    "OpOverload._schema, Tensor._is_zerotensor": re.compile(r"_schema|_is_zerotensor"),
    # functional collectives, the dispatcher operations that make_fx records and Inductor
    # runs (a compiled step's averaging under --nproc, mloc/runtime/base/overlap.py); their
    # only Python spelling is torch.distributed._functional_collectives, private too
    "torch.ops._c10d_functional": re.compile(r"_c10d_functional"),
}

_DICT_WRITES = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions and methods, classes, and the
    attributes and names it assigns."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
    return {n for n in out if _private(n)}


def _allowed(attr: str) -> bool:
    return any(p.fullmatch(attr) for p in ALLOWED.values())


def _mine(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def check(source: str) -> list[str]:
    """``line: what`` for every private of another object read or written in ``source``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node
    own, out = _defined(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private(node.attr) and not _mine(node.value) and node.attr not in own and not _allowed(node.attr):
                out.append((node.lineno, ast.unparse(node)))
            if node.attr == "__dict__" and not _mine(node.value) and _written(node):
                out.append((node.lineno, f"writes {ast.unparse(node)}"))
        elif _reflective(node) and node.args[1].value not in own and not _allowed(node.args[1].value):
            out.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {what}" for line, what in sorted(out)]


def _reflective(node: ast.AST) -> bool:
    """``getattr(x, "_name", ...)`` (or setattr, hasattr, delattr) of another object."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value) and not _mine(node.args[0]))


def _written(dict_node: ast.Attribute) -> bool:
    """``x.__dict__`` is written through: ``x.__dict__[k] = v``, ``del x.__dict__[k]``,
    ``x.__dict__.setdefault(...)``, ``update``, ``pop``, ..."""
    parent = dict_node.parent
    if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del)):
        return True
    return isinstance(parent, ast.Attribute) and parent.attr in _DICT_WRITES


@pytest.mark.parametrize("path", FILES, ids=[str(f.relative_to(RUNTIME)) for f in FILES])
def test_no_module_reads_or_writes_another_objects_privates(path: Path):
    assert check(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source, found", [
    ("def f(program):\n    return program._drawer('a')\n", ["2: program._drawer"]),
    ("def f(program):\n    program.__dict__.setdefault('_steps', {})\n", ["2: writes program.__dict__"]),
    ("def f(m):\n    m.__dict__['forward'] = 1\n", ["2: writes m.__dict__"]),
    ("def f(c):\n    return getattr(c, '_hidden', None)\n", ["2: getattr(c, '_hidden', None)"]),
    ("class A:\n    def g(self):\n        return self._x\n", []),
    ("def _helper(o):\n    return o\n\ndef f(o):\n    return o._helper\n", []),      # the module's own
    ("def f(m):\n    return m.__dict__.get('forward'), torch._foreach_add(m, m)\n", []),
])
def test_the_check_finds_what_it_should(source, found):
    assert check(source) == found

