"""Lowering: resolved problems and edges -> the program graph (hierarchy only).

Dataflow edges are added by `mloc.passes.dataflow` once the hierarchy is known to
be acyclic, since their kind (u2l or l2u) depends on which problem is above which.
"""

from __future__ import annotations

from mloc.ir.graph import ProgramGraph
from mloc.ir.payloads import ResolvedProgram


def lower(resolved: ResolvedProgram) -> ProgramGraph:
    g = ProgramGraph(resolved.info)
    for p in resolved.problems:
        g.add_problem(p)
    for e in resolved.edges:
        if e.upper in g and e.lower in g:
            g.add_hierarchy(e)
    return g
