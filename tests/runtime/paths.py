"""The reference the composition is tested against: the hypergradient as a sum over
paths, each re-applying its BR-VJPs (Betty's algorithm: one pass per path from the upper
down to each problem its loss reads; exponential in dense DAGs)."""

from __future__ import annotations

from mloc.runtime.base import tree
from mloc.runtime.grad.adjoints import grad_of
from mloc.runtime.grad.compose import Hierarchy


def hypergrad_paths(hier: Hierarchy, name: str) -> tuple:
    """``name``'s hypergradient by path enumeration, returned (``.grad`` untouched)."""
    plan = hier.plan(name)
    ops, points = hier.linearize(plan)
    adj = hier.seed_adjoints(plan, points)
    targets = {n: inner + ((name,) if out else ()) for n, inner, out in plan.up}
    total = [adj.pop(name, None) or tree.zeros(points[name])]

    def walk(node, vector):
        spec = hier.methods[node].vjp(ops[node], vector)
        for t in targets.get(node, ()) if spec else ():
            g = tree.fill_none(grad_of(*spec, points[t]), points[t])
            if g is None:
                continue
            if t == name:
                total[0] = tree.add(total[0], g)
            else:
                walk(t, g)

    for node, vector in adj.items():
        walk(node, vector)
    return tuple(t.detach() for t in total[0])
