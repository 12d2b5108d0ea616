"""The hierarchy pass: the declared structure must be one acyclic program.

Checks, on the declared problems and edges (so one bad option elsewhere hides nothing):
no problems at all (E213); cycles (E203); orphans, problems joined to nothing (E206);
separate sub-programs (E207); stages repeated across chains (E503); two stages of one chain
also joined by a hierarchy edge (E504). Returns True when the hierarchy is acyclic, which
the dataflow pass needs in order to tell upper from lower.
"""

from __future__ import annotations

import networkx as nx

from mloc.diagnostics import Diagnostics
from mloc.ir.payloads import ResolvedProgram


def check_hierarchy(r: ResolvedProgram, diags: Diagnostics) -> bool:
    if not r.names:
        diags.error("E213", "the program declares no problem", r.program_span,
                    help="declare one with `problem NAME { module = ..., data = ..., loss = ..., optimizer = ... }`")
        return False
    h = nx.DiGraph()
    h.add_nodes_from(r.names)
    h.add_edges_from((link.upper, link.lower) for link in r.links)
    acyclic = _cycles(r, h, diags)
    _chains(r, h, diags)
    _connectivity(r, h, diags)
    return acyclic


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


def _chains(r: ResolvedProgram, h: nx.DiGraph, diags: Diagnostics) -> None:
    seen: dict[str, object] = {}
    for chain in r.info.chains:
        for stage in chain.stages:
            if stage in seen:
                diags.error("E503", f"problem `{stage}` is a stage of more than one chain, or twice "
                            "in one", chain.span, help="each module is one stage of one chain")
            seen[stage] = chain
        for a in chain.stages:
            for b in chain.stages:
                if h.has_edge(a, b):
                    diags.error("E504", f"`{a}` and `{b}` are stages of one chain and cannot also be "
                                "upper and lower", chain.span,
                                help=f"remove the edge `{a} -> {b}`: stages are peers that feed each other forward")


def _connectivity(r: ResolvedProgram, h: nx.DiGraph, diags: Diagnostics) -> None:
    if len(r.names) < 2:
        return
    u = h.to_undirected()
    for chain in r.info.chains:
        nx.add_path(u, chain.stages)
    spans = dict(zip(r.names, r.name_spans))
    order = {n: i for i, n in enumerate(r.names)}
    comps = sorted(nx.connected_components(u), key=lambda c: (-len(c), min(order[n] for n in c)))
    for comp in comps[1:] if len(comps[0]) > 1 else comps:
        first = min(comp, key=order.__getitem__)
        if len(comp) == 1:
            diags.error("E206", f"problem `{first}` is connected to no other problem", spans[first],
                        help=f"declare where it sits, e.g. `{first} -> lower` or `upper -> {first}`, or remove it")
        else:
            names = ", ".join(f"`{n}`" for n in sorted(comp, key=order.__getitem__))
            diags.error("E207", f"problems {names} are not connected to the rest of the program",
                        spans[first], help="join them with a hierarchy edge, or move them to a program of their own")
