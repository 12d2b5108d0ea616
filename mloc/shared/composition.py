r"""How one upper's hypergradient is composed out of BR-VJPs: the :class:`Composition` the
planner computes (:func:`mloc.ir.composition.compose`) and the runtime executes
(:class:`mloc.runtime.grad.compose.Hierarchy`), and the semantics it is computed under.

The hypergradient of an upper ``U`` is the total derivative of its loss with every problem
below it at its best response. Every BR-VJP is linear in its input, so adjoints are
accumulated in reverse topological order: each lower's BR-VJP is applied once, to the sum
of the adjoints of all paths that cross it. A :class:`Composition` is everything about that
pass which depends only on the program's structure:

- ``down``: the problems below ``U``, uppers first: the order their points are built in;
- ``up``: ``(lower, inner targets, feeds the top)`` bottom-up: where each BR-VJP sends its
  adjoint (to problems inside the pass, and/or straight into ``U``'s final backward);
- ``seeds``: the problems ``U``'s loss reads whose partials start the pass;
- ``nested``: under ``exact`` semantics, each middle solved through its reduced objective,
  with the ``up`` steps and the problems of the nested pass below it;
- ``shape``: which step runs: ``"bound"`` (two levels, the method's own straight-line step),
  ``"fused"`` (two levels, reverse ``itd``: one backward through the unrolled steps),
  ``"single"`` (two levels: seed, one BR-VJP, one backward) or ``"general"``.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass
from typing import Iterable, Mapping

SEMANTICS = ("exact", "per_edge")
"""Hypergradients above two levels: the nested total derivative, or Betty's per-edge one."""

Step = tuple[str, tuple[str, ...], bool]  # (lower, inner targets, feeds the top)


@dataclass(frozen=True)
class Composition:
    """One upper's hypergradient pass (see the module docstring)."""

    top: str
    down: tuple[str, ...]
    up: tuple[Step, ...]
    seeds: tuple[str, ...]
    nested: tuple[tuple[str, tuple[Step, ...], tuple[str, ...]], ...] = ()  # (middle, up, below)
    live_seeds: bool = True  # no seed is unrolled: the seeds are the live parameters
    shape: str = "general"


def topo(nodes: Iterable[str], preds: Mapping[str, set[str]], hint: str = "") -> tuple[str, ...]:
    """``nodes`` in a topological order of ``preds`` (deterministic); a cycle is an error."""
    nodes = set(nodes)
    try:
        sorter = graphlib.TopologicalSorter({n: sorted(preds.get(n, set()) & nodes)
                                             for n in sorted(nodes)})
        return tuple(sorter.static_order())
    except graphlib.CycleError as err:
        raise ValueError(f"cycle among problems: {' -> '.join(err.args[1])}{hint}") from None
