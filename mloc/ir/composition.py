r"""The planner's half of a hypergradient's composition: each upper's
:class:`~mloc.shared.composition.Composition` (what it is: see that module), computed from
the program's structure (who reads whom, the hierarchy edges, the semantics) and what each
edge's method can do (:class:`StepCaps`, read from its descriptor).

"A middle problem reads a lower one" (feedback) is :func:`feedback`, computed once per
program: the planner decides the runtime semantics with it, and under ``exact`` the
compositions differentiate those middles through their reduced objectives. A runtime
hierarchy built by hand (tests, benchmarks, `mloc hypergrad --check`) gets its compositions
from :func:`compositions_of`. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from mloc.builtins import METHODS
from mloc.shared.composition import Composition, topo

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


def method_caps(method) -> StepCaps:
    """The :class:`StepCaps` of a runtime method object: those of the descriptor whose
    ``runtime`` names its class (identity, not a naming convention), its fields the
    method's options (an object of any other class, such as a test's wrapper, has none)."""
    for name, desc in METHODS.items():
        if desc.runtime is not None and desc.load() is type(method):
            return step_caps(name, getattr(method, "__dict__", {}))
    return StepCaps()


def compositions_of(problems: Iterable, edges: Iterable, semantics: str = "per_edge"
                    ) -> dict[str, Composition]:
    """Every upper's composition for a runtime hierarchy built by hand: ``problems`` have a
    ``name`` and ``reads``, ``edges`` an ``upper``, a ``lower`` and a runtime ``method``
    object (:class:`mloc.runtime.grad.compose.Edge`)."""
    reads = {p.name: tuple(p.reads) for p in problems}
    uppers: dict[str, set[str]] = {n: set() for n in reads}
    caps = {}
    for e in edges:
        uppers[e.lower].add(e.upper)
        caps[e.lower] = method_caps(e.method)
    reduced = feedback(reads, uppers) if semantics == "exact" else {}
    return compose_all(reads, uppers, caps, reduced)


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
