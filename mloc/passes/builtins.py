"""Bind a call of a built-in (optimizer, method, schedule) to its descriptor's `Signature`.

Reports unknown names with a did-you-mean, positional-after-keyword, too many or
duplicate arguments, unknown keywords, missing required ones, and each argument's type
and range. Returns a `Builtin` with every parameter bound (defaults filled in), or None.
A built-in that is checked but has no runtime yet is reported E704 at the call, and still
bound, so that the checks downstream of it run as well.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import Builtin
from mloc.builtins import REQUIRED, Descriptor, Signature
from mloc.lang.types import INVALID

_UNKNOWN = {"optimizers": ("E301", "optimizer"), "methods": ("E302", "hypergradient method"),
            "schedules": ("E311", "schedule")}


def bind_builtin(value: ast.Value, table: dict[str, Descriptor], table_name: str,
                 diags: Diagnostics) -> Builtin | None:
    code, what = _UNKNOWN[table_name]
    if isinstance(value, ast.Call):
        func, args = value.func, value.args
    elif isinstance(value, ast.Name):
        func, args = value, ()
    else:
        article = "an" if what[0] in "aeiou" else "a"
        diags.error("E304", f"expected {article} {what} such as `{next(iter(table))}(...)`, got a literal",
                    value.span, help="available: " + ", ".join(f"`{n}`" for n in table))
        return None
    descriptor = table.get(func.dotted)
    if descriptor is None:
        hint = did_you_mean(func.dotted, table) or "available: " + ", ".join(f"`{n}`" for n in table)
        diags.error(code, f"unknown {what} `{func.dotted}`", func.span, label=f"not {'an' if what[0] in 'aeiou' else 'a'} {what}", help=hint)
        return None
    if not descriptor.executable:
        _not_implemented(descriptor, table, what, value.span, diags)
    sig = descriptor.signature
    bound = _bind_args(sig, args, value.span, diags)
    if bound is None:
        return None
    _lint(sig, bound, args, value.span, diags)
    return Builtin(sig.name, tuple((p.name, bound[p.name]) for p in sig.params), value.span)


def _not_implemented(descriptor: Descriptor, table: dict[str, Descriptor], what: str, span,
                     diags: Diagnostics) -> None:
    ready = [f"`{n}`" for n, d in table.items() if d.runtime is not None]
    diags.error("E704", f"`{descriptor.name}` is checked but not implemented yet: a program "
                "using it cannot be compiled or run", span, label=f"{what} without a runtime",
                help=f"use {', '.join(ready[:-1])} or {ready[-1]} for now; `mloc check` still "
                     "checks this call's arguments")


def _lint(sig: Signature, bound: dict, args: tuple[ast.Arg, ...], span, diags: Diagnostics) -> None:
    """Warnings for arguments that have no effect with the others chosen."""
    if bound.get("nesterov") and bound.get("momentum") == 0:
        arg = next((a for a in args if a.keyword and a.keyword.name == "nesterov"), None)
        diags.warn("W102", f"`nesterov=true` has no effect without momentum in `{sig.name}`",
                   arg.span if arg else span, help="set `momentum`, e.g. momentum=0.9, or drop `nesterov`")


def _bind_args(sig: Signature, args: tuple[ast.Arg, ...], span, diags: Diagnostics) -> dict | None:
    given: dict[str, ast.Arg] = {}
    ok = True
    seen_keyword = positional_error = False
    for i, arg in enumerate(args):
        if arg.keyword is None:
            if seen_keyword:
                meant = sig.params[i].name if i < len(sig.params) else sig.params[0].name if sig.params else "x"
                diags.error("E308", "a positional argument cannot follow keyword arguments", arg.span,
                            help=f"name it, e.g. `{meant}={arg.value.span.text}`, or move it before the keywords")
                ok = False
                positional_error = True
                continue
            if i >= len(sig.params):
                diags.error("E309", f"`{sig.name}` takes at most {len(sig.params)} positional "
                            f"argument(s), got {len(args)}", arg.span,
                            help=_signature_text(sig))
                ok = False
                positional_error = True
                continue
            name = sig.params[i].name
        else:
            seen_keyword = True
            name = arg.keyword.name
            if sig.param(name) is None:
                hint = did_you_mean(name, [p.name for p in sig.params]) or _signature_text(sig)
                diags.error("E303", f"`{sig.name}` has no argument `{name}`", arg.keyword.span,
                            label="unknown argument", help=hint)
                ok = False
                continue
        if name in given:
            diags.error("E307", f"argument `{name}` of `{sig.name}` is given twice", arg.span,
                        help="remove one of them")
            ok = False
            continue
        given[name] = arg
    # type errors are independent: report them too; a misplaced positional argument was
    # meant for some parameter, so do not also call that parameter missing
    values = _check_values(sig, given, span, diags, report_missing=not positional_error)
    return values if ok else None


def _check_values(sig: Signature, given: dict[str, ast.Arg], span, diags: Diagnostics,
                  report_missing: bool = True) -> dict | None:
    out: dict = {}
    ok = True
    for p in sig.params:
        if p.name in given:
            v = p.type.check(given[p.name].value, f"`{p.name}` of `{sig.name}`", diags)
            ok &= v is not INVALID
            out[p.name] = v
        elif p.default is REQUIRED:
            ok = False
            if not report_missing:
                continue
            diags.error("E306", f"`{sig.name}` needs the argument `{p.name}`", span,
                        help=f"add `{p.name}=...`: {p.doc or p.type.expected}")
            ok = False
        else:
            out[p.name] = p.default
    return out if ok else None


def _signature_text(sig: Signature) -> str:
    parts = [p.name if p.default is REQUIRED else f"{p.name}={p.default!r}" for p in sig.params]
    return f"`{sig.name}` takes ({', '.join(parts)})" if parts else f"`{sig.name}` takes no arguments"
