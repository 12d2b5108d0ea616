"""Which hypergradient methods can differentiate which lower problems.

A method's `caps.needs` names the optimizer capabilities it requires of the lower
problem's optimizer (`mloc.builtins`): `itd` backpropagates through the optimizer's update,
so it needs a `differentiable` one (shampoo is, with its roots held constant between
refreshes; a `torch.optim` optimizer is not: it steps in place); `sama` needs the diagonal ∂update/∂grad
(`sama_diag`). A missing one is E401, with the optimizer's `caps.opaque` as a note. An unrolling method
cannot differentiate more steps than the edge unrolls (its `steps` default to the edge's
`unroll`), and `truncate` cannot exceed `steps` (E402).
"""

from __future__ import annotations

from dataclasses import replace

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.diagnostics import Diagnostics
from mloc.ir.payloads import Builtin, HierarchyEdge, ProblemNode


def _with(builtin: Builtin, **changes) -> Builtin:
    return replace(builtin, args=tuple((k, changes.get(k, v)) for k, v in builtin.args))


def providers(capability: str) -> list[str]:
    """The optimizers that have `capability`, in registry order."""
    return [n for n, d in OPTIMIZERS.items() if capability in d.caps.provides]


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def _shown(opt: Builtin) -> str:
    """An optimizer as the program names it: `torch.optim.RAdam` for a Python reference."""
    ref = OPTIMIZERS[opt.name].signature.reference
    return getattr(opt.get(ref.name), "text", opt.name) if ref else opt.name


def _missing(capability: str, method: Builtin, opt: Builtin, lower: str, diags: Diagnostics) -> None:
    have, shown = providers(capability), _shown(opt)
    why = OPTIMIZERS[opt.name].caps.opaque
    notes = (f"`{method.name}` {_USES[capability]}, but {why}",) if why and capability in _USES else ()
    if capability == "differentiable":
        diags.error("E401", f"`{method.name}` cannot differentiate through `{shown}`, the optimizer "
                    f"of `{lower}`", method.span, label="not differentiable",
                    help=f"use an implicit method such as `cg(...)` or `neumann(...)`, or give "
                    f"`{lower}` a differentiable optimizer ({', '.join(have)})", notes=notes)
    elif capability == "sama_diag":
        diags.error("E401", f"`{method.name}` has no diagonal update Jacobian for `{shown}`, the "
                    f"optimizer of `{lower}`", method.span,
                    help=f"use `finite_diff(...)`, or {_listed(have)} for the lower problem",
                    notes=notes)
    else:
        diags.error("E401", f"`{method.name}` needs `{capability}` of the lower optimizer, which "
                    f"`{shown}`, the optimizer of `{lower}`, does not have", method.span,
                    help=f"use {_listed(have) or 'another method'} for the lower problem")


# What a method does with the capability it needs, for E401's note.
_USES = {"differentiable": "backpropagates through the lower optimizer's unrolled updates",
         "sama_diag": "preconditions by the diagonal of the lower optimizer's ∂update/∂grad"}


def check_method(edge: HierarchyEdge, lower: ProblemNode, diags: Diagnostics) -> Builtin | None:
    """The edge's method with defaults that depend on the edge filled in, or None on error."""
    method, opt = edge.method, lower.optimizer
    caps = METHODS[method.name].caps
    missing = sorted(caps.needs - OPTIMIZERS[opt.name].caps.provides)
    if missing:
        _missing(missing[0], method, opt, lower.name, diags)
        return None
    if not caps.unrolls:
        return method
    steps = method.get("steps") or edge.unroll
    if steps > edge.unroll:
        diags.error("E402", f"`{method.name}` differentiates {steps} steps but the edge unrolls "
                    f"only {edge.unroll}", method.span,
                    help=f"set `unroll = {steps}` on the edge, or `steps` to at most {edge.unroll}")
        return None
    truncate = method.get("truncate")
    if truncate is not None and truncate > steps:
        diags.error("E402", f"`truncate={truncate}` keeps more steps than the {steps} "
                    "differentiated", method.span, help=f"use a truncate of at most {steps}")
        return None
    return _with(method, steps=steps)
