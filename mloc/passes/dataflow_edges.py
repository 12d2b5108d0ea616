"""Infer dataflow edges from the problems each loss names, and check they fit the hierarchy.

For each problem P and each problem Q that P's loss reads (or that P's `init` names):
Q above P gives a u2l edge Q -> P (Betty's upper-to-lower), Q below P an l2u edge, an
earlier stage of P's chain a `chain` edge. Anything else is an error (E210). Then every
hierarchy edge must carry dataflow (E209), an upper problem must read some problem below
it (E211), a lowest problem must read itself (E212), chain stages must read the stage
before (E505), and methods other than `itd`/`first_order` cannot see an upper problem that
enters only through `init` (E403).
"""

from __future__ import annotations

import networkx as nx

from mloc.diagnostics import Diagnostics
from mloc.ir.graph import ProgramGraph
from mloc.ir.payloads import DataflowEdge, ProblemNode, ResolvedProgram

INIT_METHODS = frozenset({"itd", "first_order", "auto"})


def infer_dataflow(g: ProgramGraph, r: ResolvedProgram, diags: Diagnostics) -> None:
    """`r` supplies the declared hierarchy, so a problem whose own fields had errors (absent
    from `g`) still counts as above or below the others: no cascade of follow-on errors."""
    h = nx.DiGraph()
    h.add_nodes_from(r.names)
    h.add_edges_from((link.upper, link.lower) for link in r.links)
    declared = set(r.names)
    chain_pos = {s: (i, c) for c in g.info.chains for i, s in enumerate(c.stages)}
    for p in g.problems():
        for q, span, via in _reads(p):
            if q == p.name or q not in declared:
                continue
            kind = _kind(h, chain_pos, q, p.name, via)
            if kind is None:
                _unrelated(p, q, span, via, diags)
            elif q in g:
                g.add_dataflow(DataflowEdge(q, p.name, kind, via, span))
    _check_edges(g, diags)
    _check_problems(g, h, diags)
    _check_chains(g, diags)


def _reads(p: ProblemNode):
    for q, span in p.loss.reads:
        yield q, span, "loss"
    if p.init is not None:
        yield p.init[0], p.init[1], "init"


def _kind(h: nx.DiGraph, chain_pos: dict, q: str, p: str, via: str) -> str | None:
    if nx.has_path(h, q, p):
        return "u2l"
    if via == "loss" and nx.has_path(h, p, q):
        return "l2u"
    if via == "loss" and q in chain_pos and p in chain_pos:
        (iq, cq), (ip, cp) = chain_pos[q], chain_pos[p]
        if cq is cp and iq < ip:
            return "chain"
    return None


def _unrelated(p: ProblemNode, q: str, span, via: str, diags: Diagnostics) -> None:
    if via == "init":
        diags.error("E210", f"`{p.name}` starts from `{q}`'s parameters, but `{q}` is not above "
                    f"`{p.name}`", span, help=f"declare `{q} -> {p.name}`")
        return
    diags.error("E210", f"the loss of `{p.name}` reads `{q}`, which is neither above nor below it",
                span, label="unrelated problem",
                help=f"declare `{q} -> {p.name}` if `{q}` should be tuned through `{p.name}`, "
                     f"or remove `{q}` from the loss")


def _check_edges(g: ProgramGraph, diags: Diagnostics) -> None:
    flows = {(e.src, e.dst): e for e in g.dataflow_edges() if e.kind == "u2l"}
    for edge in g.hierarchy_edges():
        lower = g.problem(edge.lower)
        reads_upper = any(q == edge.upper for q, _, _ in _reads(lower))
        if not reads_upper:
            diags.error("E209", f"`{edge.upper}` sits above `{edge.lower}`, but `{edge.lower}` never "
                        f"reads `{edge.upper}`", edge.span,
                        help=f"pass `{edge.upper}` to the loss of `{edge.lower}`, or set "
                             f"`init = {edge.upper}` in `{edge.lower}` (MAML)")
            continue
        via_loss = any(q == edge.upper for q, _ in lower.loss.reads)
        flow = flows.get((edge.upper, edge.lower))
        if not via_loss and flow is not None and edge.method.name not in INIT_METHODS:
            diags.error("E403", f"`{edge.method.name}` cannot carry a hypergradient to `{edge.upper}`: "
                        f"`{edge.lower}` reads it only through `init`", edge.method.span,
                        help="use `itd(...)` (MAML), `first_order`, or read the upper problem in "
                             "the loss (a proximal term, as iMAML does)")


def _check_problems(g: ProgramGraph, h: nx.DiGraph, diags: Diagnostics) -> None:
    for p in g.problems():
        below = nx.descendants(h, p.name)
        read = {q for q, _ in p.loss.reads}
        if below and not read & below:
            diags.error("E211", f"`{p.name}` sits above {_list(below)}, but its loss reads none of them",
                        p.loss.span, help=f"pass a problem below it to its loss, e.g. `{sorted(below)[0]}`")
        elif not below and p.name not in read:
            diags.error("E212", f"the loss of `{p.name}` never reads `{p.name}`, so its optimizer has "
                        "nothing to train", p.loss.span, help=f"pass `{p.name}` to its loss")


def _check_chains(g: ProgramGraph, diags: Diagnostics) -> None:
    for chain in g.info.chains:
        for prev, stage in zip(chain.stages, chain.stages[1:]):
            if stage in g and prev not in {q for q, _ in g.problem(stage).loss.reads}:
                diags.error("E505", f"stage `{stage}` follows `{prev}` in the chain, but its loss does "
                            f"not read `{prev}`", g.problem(stage).loss.span,
                            help=f"pass `{prev}` to the loss of `{stage}`: its features are this stage's input")


def _list(names) -> str:
    names = sorted(names)
    return ", ".join(f"`{n}`" for n in names[:3]) + (" ..." if len(names) > 3 else "")
