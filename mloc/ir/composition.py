r"""How one upper's hypergradient is composed out of BR-VJPs: computed once, executed by the runtime.

The hypergradient of an upper ``U`` is the total derivative of its loss with every problem
below it at its best response. Every BR-VJP is linear in its input, so adjoints are
accumulated in reverse topological order: each lower's BR-VJP is applied once, to the sum
of the adjoints of all paths that cross it. A :class:`Composition` is everything about that
pass which depends only on the program's structure (who reads whom, the hierarchy edges,
the semantics, and what each method can do, :class:`StepCaps`):

- ``down``: the problems below ``U``, uppers first: the order their points are built in;
- ``up``: ``(lower, inner targets, feeds the top)`` bottom-up: where each BR-VJP sends its
  adjoint (to problems inside the pass, and/or straight into ``U``'s final backward);
- ``seeds``: the problems ``U``'s loss reads whose partials start the pass;
- ``nested``: under ``exact`` semantics, each middle solved through its reduced objective,
  with the ``up`` steps and the problems of the nested pass below it;
- ``shape``: which step runs: ``"bound"`` (two levels, the method's own straight-line step),
  ``"fused"`` (two levels, reverse ``itd``: one backward through the unrolled steps),
  ``"single"`` (two levels: seed, one BR-VJP, one backward) or ``"general"``.

"A middle problem reads a lower one" (feedback) is :func:`feedback`, computed once per
program: the planner decides the runtime semantics with it, and under ``exact`` the
compositions differentiate those middles through their reduced objectives.

The compiler's planner computes one ``Composition`` per upper and generated code hands them
to the runtime; a runtime built by hand computes them with the same :func:`compose`.
Nothing here imports torch.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass
from typing import Iterable, Mapping

from mloc.builtins import METHODS

Step = tuple[str, tuple[str, ...], bool]  # (lower, inner targets, feeds the top)
_SIMULTANEOUS = (" (under `exact` semantics, two problems that feed back through a shared"
                 " lower form a simultaneous game; use `per_edge`)")


@dataclass(frozen=True)
class StepCaps:
    """What the composer needs to know of one edge's method, derived from its descriptor's
    :class:`~mloc.builtins.MethodCaps` and the edge's options by :func:`step_caps`.

    ``zero``: no indirect term, skipped entirely (``first_order``). ``unrolls``: its point
    is ``θ_K``, not the live parameters (``itd``). ``fusable``: two levels, the top's loss
    can back-propagate through ``θ_K`` directly (reverse-mode ``itd``). ``two_level``: the
    runtime method offers its whole two-level step as one closure (``finite_diff``,
    ``sama``: ``two_level(...)``), with the same numbers as the general path.
    """

    zero: bool = False
    unrolls: bool = False
    fusable: bool = False
    two_level: bool = False


def step_caps(method: str, args: Mapping[str, object]) -> StepCaps:
    """The :class:`StepCaps` of method ``method`` (a name in ``mloc.builtins.METHODS``) with
    options ``args``; a name it does not hold (a test's own method class) has none."""
    desc = METHODS.get(method)
    if desc is None:
        return StepCaps()
    c = desc.caps
    return StepCaps(zero=c.no_indirect, unrolls=c.unrolls, two_level=c.two_level,
                    fusable=c.fusable and args.get("mode", "reverse") == "reverse")


def factory_caps(factory: type, args: Mapping[str, object]) -> StepCaps:
    """The :class:`StepCaps` of a runtime method object of class ``factory``: the caps of the
    descriptor whose ``runtime`` names that class (identity, not a naming convention), with
    options ``args``. Called by the runtime only (``Descriptor.load`` imports it)."""
    for name, desc in METHODS.items():
        if desc.runtime is not None and desc.load() is factory:
            return step_caps(name, args)
    return StepCaps()


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


def below(lowers: Mapping[str, set[str]], name: str) -> set[str]:
    """Every problem below ``name`` (its lowers, theirs, ...)."""
    seen, stack = set(), [name]
    while stack:
        for low in lowers[stack.pop()] - seen:
            seen.add(low)
            stack.append(low)
    return seen


def feedback(reads: Mapping[str, tuple[str, ...]], uppers: Mapping[str, set[str]]
             ) -> dict[str, frozenset[str]]:
    """A middle problem reads a lower one: each middle (a problem with an upper) whose loss
    reads a problem below it, mapped to everything below it (in ``reads``' order).
    ``reads``: each problem's loss reads; ``uppers``: each problem's hierarchy uppers."""
    lowers = _lowers(reads, uppers)
    out = {}
    for name, read in reads.items():
        if uppers.get(name):
            under = below(lowers, name)
            if under & set(read):
                out[name] = frozenset(under)
    return out


def compose(top: str, reads: Mapping[str, tuple[str, ...]], uppers: Mapping[str, set[str]],
            caps: Mapping[str, StepCaps], reduced: Mapping[str, frozenset[str]]) -> Composition:
    """The composition of ``top``'s hypergradient.

    ``reads``: each problem's loss reads; ``uppers``: each problem's hierarchy uppers;
    ``caps``: each lower's method's :class:`StepCaps`; ``reduced``: the middles solved
    through their reduced objectives (:func:`feedback` under ``exact``, empty under
    ``per_edge``). A middle's BR-VJP then also sends adjoints to the uppers of the problems
    below it, which the order takes into account.
    """
    inside = below(_lowers(reads, uppers), top)
    scope = inside | {top}
    under = {n: reduced.get(n, frozenset()) for n in inside}
    targets = {n: set() if caps[n].zero else _targets(n, scope, under, uppers) for n in inside}
    down = tuple(n for n in topo(scope, uppers) if n != top)
    order = topo(inside, {n: {b for b in inside if n in targets[b]} for n in inside}, _SIMULTANEOUS)

    def steps(nodes):
        return tuple((n, tuple(sorted(targets[n] & nodes)), bool(targets[n] - nodes))
                     for n in order if n in nodes and targets[n])

    nested = []
    for m in sorted(n for n in inside if under[n]):
        _check_differentiable(m, under[m], caps)
        nested.append((m, steps(under[m]), tuple(sorted(under[m]))))
    seeds = tuple(r for r in reads[top] if r == top or targets.get(r))
    live = not any(caps[r].unrolls for r in seeds if r in caps)
    up = steps(inside)
    return Composition(top, down, up, seeds, tuple(nested), live, _shape(down, up, seeds, caps))


def compose_all(reads: Mapping[str, tuple[str, ...]], uppers: Mapping[str, set[str]],
                caps: Mapping[str, StepCaps], reduced: Mapping[str, frozenset[str]]
                ) -> dict[str, Composition]:
    """:func:`compose` for every problem with a lower, in ``reads``' order."""
    has_lower = {u for ups in uppers.values() for u in ups}
    return {n: compose(n, reads, uppers, caps, reduced) for n in reads if n in has_lower}


def _lowers(reads, uppers):
    lowers = {n: set() for n in reads}
    for low, ups in uppers.items():
        for u in ups:
            lowers[u].add(low)
    return lowers


def _targets(node, scope, under, uppers):
    """Where ``node``'s BR-VJP sends adjoints (``exact`` adds its lowers' uppers)."""
    targets = set(uppers[node])
    for b in under[node]:  # empty unless `exact` and a lower feeds back into node
        targets |= uppers[b]
    return (targets - under[node] - {node}) & scope


def _shape(down, up, seeds, caps) -> str:
    """Two levels (one lower feeding only the top) get a straight-line step."""
    if len(down) != 1 or len(up) != 1 or up[0][1:] != ((), True):
        return "general"
    c = caps[down[0]]
    if c.fusable:
        return "fused"
    if seeds != down or c.unrolls:
        return "general"
    return "bound" if c.two_level else "single"


def _check_differentiable(middle, under, caps):
    for b in under:
        if b in caps and caps[b].unrolls:
            raise ValueError(f"exact semantics: {b!r} lies below middle level {middle!r} "
                             "and cannot be unrolled (use cg or neumann there)")
