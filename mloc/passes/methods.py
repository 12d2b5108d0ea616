"""Which hypergradient methods can differentiate which lower problems.

- `itd` backpropagates through the lower optimizer's update, so that optimizer must be
  differentiable (sgd, adam, adamw; not shampoo, whose matrix roots are not). It cannot
  differentiate more steps than the edge unrolls, and `truncate` cannot exceed `steps`.
- `sama` needs the diagonal ∂update/∂grad of the lower optimizer (sgd, adam, adamw).
"""

from __future__ import annotations

from dataclasses import replace

from mloc.diagnostics import Diagnostics
from mloc.ir.payloads import Builtin, HierarchyEdge, ProblemNode
from mloc.lang.vocabulary import OPTIMIZERS


def _with(builtin: Builtin, **changes) -> Builtin:
    return replace(builtin, args=tuple((k, changes.get(k, v)) for k, v in builtin.args))


def check_method(edge: HierarchyEdge, lower: ProblemNode, diags: Diagnostics) -> Builtin | None:
    """The edge's method with defaults that depend on the edge filled in, or None on error."""
    method, opt = edge.method, lower.optimizer
    tags = OPTIMIZERS[opt.name].tags
    if method.name == "itd" and "differentiable" not in tags:
        diags.error("E401", f"`itd` cannot differentiate through `{opt.name}`, the optimizer of "
                    f"`{lower.name}`", method.span, label="not differentiable",
                    help=f"use an implicit method such as `cg(...)` or `neumann(...)`, or give "
                    f"`{lower.name}` a differentiable optimizer (sgd, adam, adamw)")
        return None
    if method.name == "sama" and "sama" not in tags:
        diags.error("E401", f"`sama` has no diagonal update Jacobian for `{opt.name}`, the "
                    f"optimizer of `{lower.name}`", method.span,
                    help="use `finite_diff(...)`, or sgd, adam or adamw for the lower problem")
        return None
    if method.name != "itd":
        return method
    steps = method.get("steps") or edge.unroll
    if steps > edge.unroll:
        diags.error("E402", f"`itd` differentiates {steps} steps but the edge unrolls only "
                    f"{edge.unroll}", method.span,
                    help=f"set `unroll = {steps}` on the edge, or `steps` to at most {edge.unroll}")
        return None
    truncate = method.get("truncate")
    if truncate is not None and truncate > steps:
        diags.error("E402", f"`truncate={truncate}` keeps more steps than the {steps} "
                    "differentiated", method.span, help=f"use a truncate of at most {steps}")
        return None
    return _with(method, steps=steps)
