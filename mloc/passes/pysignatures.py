"""The signatures of the user's functions and classes, read with `ast` (never imported), and
the check that a call in the `.mlo` file fits one: `mloc check` catches
`lib.loss(model, batch)` against `def loss(model, hyper, batch)` before anything runs.

Python's own rules, as `inspect.Signature.bind` applies them: too many positional
arguments is E309, a keyword the function does not take E303 (with a did-you-mean), an
argument given both by position and by keyword E307, a required one left out E306. A
class is checked against its `__init__` (without `self`). Only what the file states
plainly is checked: a decorated function or class (a decorator may change the signature),
a class without its own `__init__` (it inherits one), a name bound twice at module level,
or anything not defined by `def`/`class` at the top level is skipped.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast as mlo
from mloc.passes.pymodules import parse_module


@dataclass(frozen=True)
class PySignature:
    """`positional`: the parameters that take positional arguments, in order (the first
    `posonly` of them only positionally); `required` how many of them have no default."""

    name: str
    positional: tuple[str, ...]
    posonly: int
    required: int
    kwonly: tuple[str, ...]
    kwonly_required: tuple[str, ...]
    varargs: bool
    varkw: bool
    path: str
    line: int

    def text(self) -> str:
        """`def loss(model, hyper, batch)` as the source declares it (defaults shown as `=...`)."""
        parts = [p if i < self.required else f"{p}=..." for i, p in enumerate(self.positional)]
        if self.posonly:
            parts.insert(self.posonly, "/")
        if self.varargs:
            parts.append("*args")
        elif self.kwonly:
            parts.append("*")
        parts += [k if k in self.kwonly_required else f"{k}=..." for k in self.kwonly]
        parts += ["**kwargs"] if self.varkw else []
        return f"{self.name}({', '.join(parts)})"


def signature_of(path: Path | None, attr: str) -> PySignature | None:
    """The signature of the top-level `attr` of the module at `path`, if it is plain."""
    if path is None or "." in attr:
        return None
    try:
        table = _signatures(path, path.stat().st_mtime)
    except OSError:
        return None
    return table.get(attr)


@functools.lru_cache(maxsize=64)
def _signatures(path: Path, mtime: float) -> dict[str, PySignature]:
    tree = parse_module(path)
    if not isinstance(tree, ast.Module):        # unreadable, or E109 (`mloc.passes.pymodules`)
        return {}
    out: dict[str, PySignature | None] = {}
    for node in tree.body:
        for name in _bound_names(node):
            out[name] = None if name in out else _signature(node, name, str(path))
    return {k: v for k, v in out.items() if v is not None}


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)] + \
        [n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not node]


def _signature(node: ast.stmt, name: str, path: str) -> PySignature | None:
    if isinstance(node, ast.FunctionDef) and not node.decorator_list:
        return _from_args(name, node.args, path, node.lineno, drop_self=False)
    if isinstance(node, ast.ClassDef) and not node.decorator_list:
        init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        if len(init) == 1 and not init[0].decorator_list:
            return _from_args(name, init[0].args, path, init[0].lineno, drop_self=True)
    return None


def _from_args(name: str, a: ast.arguments, path: str, line: int, *, drop_self: bool) -> PySignature | None:
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    posonly = len(a.posonlyargs)
    if drop_self:
        if not positional:
            return None
        positional, posonly = positional[1:], max(0, posonly - 1)
    required = len(positional) - len(a.defaults)
    kwonly = tuple(p.arg for p in a.kwonlyargs)
    kwonly_required = tuple(p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None)
    return PySignature(name, tuple(positional), posonly, required, kwonly, kwonly_required,
                       a.vararg is not None, a.kwarg is not None, path, line)


def check_call(call: mlo.Call, sig: PySignature, shown_path: str, diags: Diagnostics) -> bool:
    """Report what in `call` does not fit `sig` (Python's binding rules); True when it fits."""
    where = f"`{sig.text()}` at {shown_path}:{sig.line}"
    positional = [a for a in call.args if a.keyword is None]
    keywords = [a for a in call.args if a.keyword is not None]
    ok = True
    if len(positional) > len(sig.positional) and not sig.varargs:
        extra = positional[len(sig.positional)]
        diags.error("E309", f"`{call.func.dotted}` takes {_count(len(sig.positional))} positional "
                    f"argument{'s' * (len(sig.positional) != 1)}, but {len(positional)} are given",
                    extra.span.to(positional[-1].span), label="too many",
                    help=f"check the call against {where}")
        ok = False
    bound, by_keyword = set(sig.positional[:len(positional)]), set()
    for arg in keywords:
        word = arg.keyword.name
        if word in bound:
            how = "twice by keyword" if word in by_keyword else "by position and by keyword"
            diags.error("E307", f"`{word}` of `{call.func.dotted}` is given {how}",
                        arg.keyword.span, label="given twice", help=f"drop one of them; {where}")
            ok = False
        elif (word in sig.positional[sig.posonly:] or word in sig.kwonly) or sig.varkw:
            bound.add(word)
            by_keyword.add(word)
        else:
            takes = [*sig.positional[sig.posonly:], *sig.kwonly]
            hint = did_you_mean(word, takes)
            diags.error("E303", f"`{call.func.dotted}` has no parameter `{word}`", arg.keyword.span,
                        label="unknown argument", help=(hint + " " if hint else "") + f"see {where}")
            ok = False
    missing = [p for p in (*sig.positional[:sig.required], *sig.kwonly_required) if p not in bound]
    if ok and missing:
        names = ", ".join(f"`{p}`" for p in missing)
        needed = sig.required + len(sig.kwonly_required)
        given = len(call.args)
        diags.error("E306", f"`{call.func.dotted}` needs {needed} argument{'s' * (needed != 1)}, but the call "
                    f"gives {given}", call.span, label="too few arguments",
                    help=f"the call leaves {names} without a value: pass every parameter of {where}")
        ok = False
    return ok


def _count(n: int) -> str:
    return {0: "no", 1: "one", 2: "two", 3: "three"}.get(n, str(n))
