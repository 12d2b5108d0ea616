"""Name resolution inside calls into user Python: import aliases, problems and `batch`.

A dotted name resolves against the longest import binding that prefixes it
(`lib.MLP` -> module bound as `lib`, attribute `MLP`). A bare name is a problem (where the
field allows problems), the reserved `batch` (where the field allows it), or `None`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mloc.builtins import TABLES
from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import PyCall
from mloc.passes.pymodules import PyModuleInfo
from mloc.passes.pysignatures import check_call, signature_of
from mloc.source import Span

LITERAL_NAMES = frozenset({"None"})

# The aliases Python code conventionally binds modules to: an undefined `F.relu` asks for
# `import torch.nn.functional as F`, not `import F`. The one table of them (E101's help here
# and in `mloc.passes.builtins.resolve_ref`).
CONVENTIONAL_ALIASES = {
    "torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "optim": "torch.optim",
    "dist": "torch.distributed", "np": "numpy", "pd": "pandas", "plt": "matplotlib.pyplot",
    "T": "torchvision.transforms",
}


def import_line(head: str) -> str:
    """The `import` that binds `head`: `import torch.nn.functional as F` for a conventional
    alias, else `import head`."""
    module = CONVENTIONAL_ALIASES.get(head, head)
    return f"import {module}" if module == head else f"import {module} as {head}"


@dataclass
class Scope:
    """What names mean in one program: import bindings and problem names."""

    imports: dict[str, PyModuleInfo | None]     # bound name -> module (None: not found)
    problems: set[str]
    used_imports: set[str]
    base: Path | None = None                    # the .mlo file's directory, for short paths

    def show(self, path: Path | None) -> str:
        if path is None:
            return "the module"
        try:
            return str(path.relative_to(self.base)) if self.base else str(path)
        except ValueError:
            return str(path)

    def binding_of(self, name: ast.Name) -> str | None:
        for k in range(len(name.parts), 0, -1):
            prefix = ".".join(name.parts[:k])
            if prefix in self.imports:
                return prefix
        return None


def resolve_pycall(value: ast.Value, what: str, scope: Scope, diags: Diagnostics, *,
                   problems: bool, batch: bool) -> PyCall | None:
    """Check a `module`/`data`/`loss`/eval value: a call into an imported module."""
    if not isinstance(value, ast.Call):
        example = f"{value.dotted}()" if isinstance(value, ast.Name) else "lib.make(...)"
        diags.error("E310", f"{what} must be a call into your Python module", value.span,
                    label="expected a call", help=f"write e.g. `{example}`")
        return None
    func = _resolve_callee(value.func, scope, diags)
    reads: list[tuple[str, Span]] = []
    ok = func is not None and _fits(value, scope, diags)
    for arg in value.args:
        ok &= _resolve_value(arg.value, scope, diags, reads, problems=problems, batch=batch)
    if not ok:
        return None
    module, attr = func
    return PyCall(value, module, attr, tuple(reads))


def _resolve_callee(name: ast.Name, scope: Scope, diags: Diagnostics) -> tuple[str, str] | None:
    binding = scope.binding_of(name)
    if binding is None or binding == name.dotted:
        _undefined(name, scope, diags, callee=True)
        return None
    scope.used_imports.add(binding)
    info = scope.imports[binding]
    attr = name.dotted[len(binding) + 1:]
    first = attr.split(".")[0]
    if info is not None and not info.open and first not in info.names:
        hint = did_you_mean(first, info.names)
        diags.error("E106", f"module `{info.dotted}` has no attribute `{first}`", name.span,
                    label="not defined there", help=hint or f"define `{first}` in {scope.show(info.path)}")
        return None
    return (info.dotted if info else binding), attr


def _fits(call: ast.Call, scope: Scope, diags: Diagnostics) -> bool:
    """Whether a call into a user's module fits the signature its source declares (read
    with `ast`; see `mloc.passes.pysignatures`); True when it cannot be known."""
    binding = scope.binding_of(call.func)
    info = scope.imports.get(binding) if binding else None
    if info is None:
        return True
    sig = signature_of(info.path, call.func.dotted[len(binding) + 1:])
    return sig is None or check_call(call, sig, scope.show(info.path), diags)


def _resolve_value(value: ast.Value, scope: Scope, diags: Diagnostics, reads: list, *,
                   problems: bool, batch: bool) -> bool:
    match value:
        case ast.Call():
            ok = _resolve_callee(value.func, scope, diags) is not None and _fits(value, scope, diags)
            for arg in value.args:
                ok &= _resolve_value(arg.value, scope, diags, reads, problems=problems, batch=batch)
            return ok
        case ast.ListValue() | ast.TupleValue():
            results = [_resolve_value(v, scope, diags, reads, problems=problems, batch=batch)
                       for v in value.items]
            return all(results)
        case ast.Name():
            return _resolve_name(value, scope, diags, reads, problems=problems, batch=batch)
    return True


def _resolve_name(name: ast.Name, scope: Scope, diags: Diagnostics, reads: list, *,
                  problems: bool, batch: bool) -> bool:
    word = name.dotted
    if scope.binding_of(name) is not None:
        return _resolve_callee(name, scope, diags) is not None
    if word in scope.problems:
        if not problems:
            diags.error("E108", f"problem `{word}` cannot be passed here", name.span,
                        help="only losses and evaluations may read problems; "
                             "build models from plain arguments")
            return False
        reads.append((word, name.span))
        return True
    if word == "batch":
        if not batch:
            diags.error("E107", "`batch` exists only inside a problem's loss", name.span,
                        help="remove it; the problem's `data` supplies the batches")
            return False
        return True
    if word in LITERAL_NAMES:
        return True
    _undefined(name, scope, diags, callee=False)
    return False


def _undefined(name: ast.Name, scope: Scope, diags: Diagnostics, *, callee: bool) -> None:
    word = name.dotted
    head = name.parts[0]
    candidates = set(scope.imports) | scope.problems | {"batch"}
    builtin = next((t for t, table in TABLES.items() if word in table), None)
    if builtin is not None:
        hint = f"`{word}` is a built-in of the {builtin[:-1]} kind, usable only in that field"
    elif len(name.parts) > 1:
        hint = did_you_mean(head, scope.imports) or f"add `{import_line(head)}` at the top of the file"
    else:
        hint = did_you_mean(word, candidates)
        if hint is None and callee:
            hint = f"call it through an imported module, e.g. `lib.{word}(...)`"
    what = "module" if len(name.parts) > 1 else "name"
    shown = head if len(name.parts) > 1 else word
    diags.error("E101", f"undefined {what} `{shown}`", name.span, label="not defined", help=hint)
