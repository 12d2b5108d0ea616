"""The hierarchy pass: the declared structure must be one acyclic program.

Checks, on the declared problems and edges (so one bad option elsewhere hides nothing):
no problems at all (E213); cycles (E203); two stages of one chain also joined by a
hierarchy edge (E504); orphans, problems joined to nothing (E206); separate sub-programs
(E207). Problems next to a declaration too broken to read (an edge or chain naming an
unknown problem) are not called orphans: the fix for that declaration fixes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from mloc.diagnostics import Diagnostics
from mloc.ir.payloads import ResolvedProgram


@dataclass(frozen=True)
class HierarchyFacts:
    acyclic: bool
    uncertain: frozenset[str]      # the resolve pass's, plus the ends of E504 edges


def declared_hierarchy(r: ResolvedProgram) -> nx.DiGraph:
    h = nx.DiGraph()
    h.add_nodes_from(r.names)
    h.add_edges_from((link.upper, link.lower) for link in r.links)
    return h


def check_hierarchy(r: ResolvedProgram, diags: Diagnostics) -> HierarchyFacts:
    if not r.names:
        diags.error("E213", "the program declares no problem", r.program_span,
                    help="declare one with `problem NAME { module = ..., data = ..., loss = ..., optimizer = ... }`")
        return HierarchyFacts(False, r.uncertain)
    h = declared_hierarchy(r)
    acyclic = _cycles(r, h, diags)
    uncertain = r.uncertain | _chains_in_hierarchy(r, diags)
    _connectivity(r, h, uncertain, diags)
    return HierarchyFacts(acyclic, uncertain)


def _cycles(r: ResolvedProgram, h: nx.DiGraph, diags: Diagnostics) -> bool:
    spans = {(link.upper, link.lower): link.span for link in r.links}
    order = {n: i for i, n in enumerate(r.names)}
    found = False
    for scc in sorted(nx.strongly_connected_components(h), key=lambda c: min(order[n] for n in c)):
        if len(scc) < 2:
            continue
        found = True
        start = min(scc, key=order.__getitem__)
        cycle = nx.find_cycle(h.subgraph(scc), source=start)
        path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
        closing = max(cycle, key=lambda e: spans[e].start)
        diags.error("E203", f"the hierarchy has a cycle: {path}", spans[closing],
                    label="this edge closes the cycle",
                    help="a problem cannot be above a problem that is above it; remove or reverse one edge")
    return not found


def _chains_in_hierarchy(r: ResolvedProgram, diags: Diagnostics) -> set[str]:
    group_of = {s: i for i, g in enumerate(r.chain_groups) for s in g}
    bad: set[str] = set()
    for link in r.links:
        if link.upper in group_of and group_of[link.upper] == group_of.get(link.lower):
            diags.error("E504", f"`{link.upper}` and `{link.lower}` are stages of one chain and cannot "
                        "also be upper and lower", link.span,
                        help="remove this edge: stages are peers that feed each other forward")
            bad |= {link.upper, link.lower}
    return bad


def _connectivity(r: ResolvedProgram, h: nx.DiGraph, uncertain: frozenset[str], diags: Diagnostics) -> None:
    if len(r.names) < 2:
        return
    u = h.to_undirected()
    for group in r.chain_groups:
        nx.add_path(u, group)
    spans = dict(zip(r.names, r.name_spans))
    order = {n: i for i, n in enumerate(r.names)}
    comps = sorted(nx.connected_components(u), key=lambda c: (-len(c), min(order[n] for n in c)))
    for comp in comps[1:] if len(comps[0]) > 1 else comps:
        if comp & uncertain:
            continue
        first = min(comp, key=order.__getitem__)
        if len(comp) == 1:
            diags.error("E206", f"problem `{first}` is connected to no other problem", spans[first],
                        help=f"declare where it sits, e.g. `{first} -> lower` or `upper -> {first}`, or remove it")
        else:
            names = ", ".join(f"`{n}`" for n in sorted(comp, key=order.__getitem__))
            diags.error("E207", f"problems {names} are not connected to the rest of the program",
                        spans[first], help="join them with a hierarchy edge, or move them to a program of their own")
