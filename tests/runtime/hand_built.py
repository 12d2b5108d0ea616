"""A runtime :class:`~mloc.runtime.grad.compose.Hierarchy` built by hand, as the runtime tests
build them: with the compositions the planner's own function computes for it."""

from __future__ import annotations

from mloc.ir.composition import compositions_of
from mloc.runtime import Hierarchy


def hierarchy(problems, edges, semantics: str = "per_edge", **options) -> Hierarchy:
    problems, edges = list(problems), list(edges)
    return Hierarchy(problems, edges, semantics, compositions=compositions_of(problems, edges, semantics),
                     **options)
