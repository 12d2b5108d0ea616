"""Bind a call of a built-in (optimizer, method, schedule) to its descriptor's `Signature`.

Reports unknown names with a did-you-mean, positional-after-keyword, too many or
duplicate arguments, unknown keywords, missing required ones, and each argument's type
and range. Returns a `Builtin` with every parameter bound (defaults filled in), or None.
A built-in that is checked but has no runtime yet is reported E704 at the call, and still
bound, so that the checks downstream of it run as well.

A dotted callee where a table has a built-in with a `Ref` parameter (`torch`, in the
optimizers and the schedules) is a Python class or factory: `torch.optim.RAdam(lr=1e-3,
betas=(0.9, 0.99))` binds to that built-in with the callee as its reference (resolved to a
`"module:attr"` `PyRef` by `resolve_ref`, without importing anything) and the keywords
it does not name collected into its `Kwargs` parameter.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import Builtin
from mloc.builtins import REQUIRED, Descriptor, Signature
from mloc.builtins.descriptor import alias_in
from mloc.shared.roots import shampoo_roots_due
from mloc.lang.types import INVALID, Options, PyRef
from mloc.passes.names import Scope, import_line
from mloc.passes.pymodules import find_module

_UNKNOWN = {"optimizers": ("E301", "optimizer"), "methods": ("E302", "hypergradient method"),
            "schedules": ("E311", "schedule")}


def bind_builtin(value: ast.Value, table: dict[str, Descriptor], table_name: str,
                 diags: Diagnostics, scope: Scope | None = None) -> Builtin | None:
    """`scope` resolves references to Python (`torch.optim.RAdam`, `lib.make`) through the
    file's imports; without it only full module paths resolve."""
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
    python = next((d for d in table.values() if d.signature.reference), None)
    if descriptor is None and len(func.parts) > 1 and python is not None:
        return _bind_python(python, func, args, value.span, scope, diags)
    if descriptor is None:
        hint = _unknown_hint(func.dotted, table, python is not None)
        diags.error(code, f"unknown {what} `{func.dotted}`", func.span, label=f"not {'an' if what[0] in 'aeiou' else 'a'} {what}", help=hint)
        return None
    if not descriptor.executable:
        _not_implemented(descriptor, table, what, value.span, diags)
    sig = descriptor.signature
    bound = _bind_args(sig, args, value.span, diags)
    if bound is None or not _resolve_refs(sig, bound, scope, diags):
        return None
    _lint(sig, bound, args, value.span, diags)
    return Builtin(sig.name, tuple((p.name, bound[p.name]) for p in sig.params), value.span)


def _bind_python(descriptor: Descriptor, func: ast.Name, args: tuple[ast.Arg, ...], span,
                 scope: Scope | None, diags: Diagnostics) -> Builtin | None:
    """`torch.optim.RAdam(lr=1e-3, ...)`: the built-in whose `reference` parameter is the
    callee, bound with the call's arguments (the callee's name in messages)."""
    sig, ref = descriptor.signature, descriptor.signature.reference
    view = Signature(func.dotted, tuple(p for p in sig.params if p is not ref), sig.doc)
    bound = _bind_args(view, args, span, diags)
    target = resolve_ref(func, scope, diags)
    if bound is None or target is None:
        return None
    bound[ref.name] = target
    return Builtin(sig.name, tuple((p.name, bound[p.name]) for p in sig.params), span)


def _resolve_refs(sig: Signature, bound: dict, scope: Scope | None, diags: Diagnostics) -> bool:
    """Replace each `Ref` argument (an `ast.Name`) by the `PyRef` it resolves to."""
    ref = sig.reference
    if ref is None or not isinstance(bound.get(ref.name), ast.Name):
        return True
    bound[ref.name] = resolve_ref(bound[ref.name], scope, diags)
    return bound[ref.name] is not None


def resolve_ref(name: ast.Name, scope: Scope | None, diags: Diagnostics) -> PyRef | None:
    """The `"module:attr"` a dotted name means: through the import that binds its head
    (`lib.make` with `import factories as lib`), else a full module path
    (`torch.optim.RAdam`); the module is the longest prefix that is one, found without
    importing it. E101 for a head that is no import and no module, E106 for a missing
    attribute (where the module's names can be read)."""
    base = scope.base if scope and scope.base else name.span.source.directory
    binding = scope.binding_of(name) if scope else None
    if binding is not None:
        scope.used_imports.add(binding)
        info = scope.imports[binding]
        if info is None:
            return None                             # E105 was reported at the import
        module, attrs = info.dotted, list(name.parts[len(binding.split(".")):])
    else:
        module, attrs = name.parts[0], list(name.parts[1:])
        info = find_module(module, base)
    if info is None or not attrs:
        head = name.parts[0]
        diags.error("E101", f"undefined module `{head}`" if info is None else
                    f"`{name.dotted}` is a module, not a class or function", name.span,
                    label="not defined" if info is None else "a module",
                    help=(did_you_mean(head, [*(scope.imports if scope else ()), "torch"])
                          or _under_torch(name, base)
                          or f"import it (`{import_line(head)}`), or write the full module path, e.g. "
                          "`torch.optim.RAdam`") if info is None else "name a class or function in it")
        return None
    while len(attrs) > 1 and (sub := find_module(f"{module}.{attrs[0]}", base)) is not None:
        module, info, attrs = f"{module}.{attrs[0]}", sub, attrs[1:]
    if attrs[0].islower() and find_module(f"{module}.{attrs[0]}", base) is not None:   # `torch.optim.sgd`
        classes = [n for n in (info.names or ()) if n.lower() == attrs[0].lower() and n != attrs[0]]
        diags.error("E101", f"`{name.dotted}` is a module, not a class or function", name.span,
                    label="a module", help=(f"did you mean `{module}.{classes[0]}`?" if classes
                                            else "name a class or function in it"))
        return None
    if not info.open and attrs[0] not in info.names:
        diags.error("E106", f"module `{module}` has no attribute `{attrs[0]}`", name.span,
                    label="not defined there", help=did_you_mean(attrs[0], info.names)
                    or f"check the name in {info.path or module}")
        return None
    return PyRef(f"{module}:{'.'.join(attrs)}", name.dotted)


def _under_torch(name: ast.Name, base) -> str | None:
    """`optim.SGD` (as after `from torch import optim`): the full path, if torch has it."""
    if name.parts[0] != "torch" and find_module(f"torch.{name.parts[0]}", base) is not None:
        return f"did you mean `torch.{name.dotted}`? (write the full module path)"
    return None


def _unknown_hint(name: str, table: dict[str, Descriptor], takes_python: bool) -> str:
    """Did-you-mean for an unknown built-in, case-insensitively (`SGD` -> `sgd`); for a
    name the literature gives a built-in (its `aliases`: `darts`), that built-in's call; for
    a torch.optim class name written bare, also the dotted call that reaches it."""
    alias = alias_in(table, name)
    if alias is not None:
        return f"did you mean `{alias.call}`? It is {alias.source}"
    folded = {n.lower(): n for n in table}
    match = folded.get(name.lower()) or did_you_mean(name, table)
    available = "available: " + ", ".join(f"`{n}`" for n in table)
    if match is None:
        return available
    hint = f"did you mean `{match}`?" if not match.startswith("did you") else match
    if takes_python and name[:1].isupper():
        hint += f" (or torch's own class: `torch.optim.{name}(lr=...)`)"
    return hint


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
    _lint_identity_roots(sig, bound, args, span, diags)


def _lint_identity_roots(sig: Signature, bound: dict, args: tuple[ast.Arg, ...], span,
                         diags: Diagnostics) -> None:
    """W106: Shampoo preconditions from step ``start + 1``, its first roots are used from
    the step :func:`~mloc.shared.roots.shampoo_roots_due` gives for the first refresh
    (``update_every + staleness``, the runtime's schedule); the roots start
    as identities, so the steps in between move along the raw gradient at the graft's norm
    (neither the grafted optimizer's direction nor a preconditioned one)."""
    start, every, stale = (bound.get(n) for n in ("start_preconditioning_step", "update_every", "staleness"))
    if not all(isinstance(v, int) for v in (start, every, stale)):
        return
    first = shampoo_roots_due(every, every, stale)
    if start + 1 >= first:
        return
    arg = next((a for a in args if a.keyword and a.keyword.name == "start_preconditioning_step"), None)
    steps = f"step {start + 1}" if start + 1 == first - 1 else f"steps {start + 1}–{first - 1}"
    diags.warn("W106", f"`{sig.name}` preconditions from step {start + 1} but its first roots are used "
               f"from step {first}: {steps} move along the raw gradient at the graft's norm "
               "(the roots start as identities)", arg.span if arg else span,
               help=f"set `start_preconditioning_step={first - 1}` (the first roots are computed at step "
                    "`update_every` and used `staleness` steps later), or refresh the roots sooner")


def _bind_args(sig: Signature, args: tuple[ast.Arg, ...], span, diags: Diagnostics) -> dict | None:
    given: dict[str, ast.Arg] = {}
    ok = True
    seen_keyword = positional_error = False
    named = [p for p in sig.params if p is not sig.rest]   # a `Kwargs` takes keywords only
    for i, arg in enumerate(args):
        if arg.keyword is None:
            if seen_keyword:
                meant = named[i].name if i < len(named) else named[0].name if named else "x"
                diags.error("E308", "a positional argument cannot follow keyword arguments", arg.span,
                            help=f"name it, e.g. `{meant}={arg.value.span.text}`, or move it before the keywords")
                ok = False
                positional_error = True
                continue
            if i >= len(named):
                diags.error("E309", f"`{sig.name}` takes at most {len(named)} positional "
                            f"argument(s), got {len(args)}", arg.span,
                            help=_signature_text(sig))
                ok = False
                positional_error = True
                continue
            name = named[i].name
        else:
            seen_keyword = True
            name = arg.keyword.name
            if sig.rest is not None and (sig.param(name) is None or sig.param(name) is sig.rest):
                name = f"**{name}"                  # one of the options passed through
            elif sig.param(name) is None:
                hint = did_you_mean(name, [p.name for p in sig.params]) or _signature_text(sig)
                diags.error("E303", f"`{sig.name}` has no argument `{name}`", arg.keyword.span,
                            label="unknown argument", help=hint)
                ok = False
                continue
        if name in given:
            diags.error("E307", f"argument `{name.lstrip('*')}` of `{sig.name}` is given twice", arg.span,
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
        if p is sig.rest:
            extra = {k[2:]: p.type.check(a.value, f"`{k[2:]}` of `{sig.name}`", diags)
                     for k, a in given.items() if k.startswith("**")}
            ok &= INVALID not in extra.values()
            out[p.name] = Options(extra) if extra else p.default
        elif p.name in given:
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
    parts = [f"**{p.name}" if p is sig.rest else p.name if p.default is REQUIRED
             else f"{p.name}={p.default!r}" for p in sig.params]
    return f"`{sig.name}` takes ({', '.join(parts)})" if parts else f"`{sig.name}` takes no arguments"
