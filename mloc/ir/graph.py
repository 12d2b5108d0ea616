"""The program graph: a networkx MultiDiGraph behind a small typed wrapper.

Nodes are problem names, each carrying one `ProblemNode`. Edges are keyed by kind:
`hierarchy` (upper -> lower, a `HierarchyEdge`) and the dataflow kinds `u2l`, `l2u` and
`chain` (src -> dst: src's parameters reach dst's loss, a `DataflowEdge`). Every accessor
returns items in a deterministic order (source order for nodes, sorted for edges), so dumps
and generated code are byte-stable.
"""

from __future__ import annotations

from typing import Iterator

import networkx as nx

from mloc.ir.payloads import DataflowEdge, HierarchyEdge, ProblemNode, ProgramInfo

DATAFLOW_KINDS = ("u2l", "l2u", "chain")


class ProgramGraph:
    def __init__(self, info: ProgramInfo):
        self.info = info
        self._g = nx.MultiDiGraph()

    # construction -------------------------------------------------------------------------
    def add_problem(self, node: ProblemNode) -> None:
        self._g.add_node(node.name, payload=node)

    def add_hierarchy(self, edge: HierarchyEdge) -> None:
        self._g.add_edge(edge.upper, edge.lower, key="hierarchy", payload=edge)

    def add_dataflow(self, edge: DataflowEdge) -> None:
        self._g.add_edge(edge.src, edge.dst, key=edge.kind, payload=edge)

    # nodes --------------------------------------------------------------------------------
    def problem(self, name: str) -> ProblemNode:
        return self._g.nodes[name]["payload"]

    def problems(self) -> tuple[ProblemNode, ...]:
        nodes = (d["payload"] for _, d in self._g.nodes(data=True))
        return tuple(sorted(nodes, key=lambda p: p.order))

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.problems())

    def __contains__(self, name: str) -> bool:
        return name in self._g

    # edges --------------------------------------------------------------------------------
    def _edges(self, kinds: tuple[str, ...]) -> Iterator:
        for u, v, k, d in self._g.edges(keys=True, data=True):
            if k in kinds:
                yield d["payload"]

    def hierarchy_edges(self) -> tuple[HierarchyEdge, ...]:
        return tuple(sorted(self._edges(("hierarchy",)), key=lambda e: (e.upper, e.lower)))

    def dataflow_edges(self) -> tuple[DataflowEdge, ...]:
        return tuple(sorted(self._edges(DATAFLOW_KINDS), key=lambda e: (e.src, e.dst, e.kind)))

    def hierarchy(self) -> nx.DiGraph:
        """The hierarchy alone, as a plain DiGraph (upper -> lower) over every problem."""
        h = nx.DiGraph()
        h.add_nodes_from(self.names())
        h.add_edges_from((e.upper, e.lower) for e in self.hierarchy_edges())
        return h

    def uppers(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(u for u, _, k in self._g.in_edges(name, keys=True) if k == "hierarchy"))

    def lowers(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(v for _, v, k in self._g.out_edges(name, keys=True) if k == "hierarchy"))

    def topological_order(self) -> tuple[str, ...]:
        """Problems from the top of the hierarchy down, ties broken by name."""
        return tuple(nx.lexicographical_topological_sort(self.hierarchy()))

    def levels(self) -> dict[str, int]:
        """Depth of each problem: 0 for the lowest problems, 1 + max over lowers otherwise."""
        h = self.hierarchy()
        depth: dict[str, int] = {}
        for n in reversed(list(nx.lexicographical_topological_sort(h))):
            depth[n] = 1 + max((depth[c] for c in h.successors(n)), default=-1)
        return depth

    def verify(self) -> list[str]:
        """Invariants every pass must keep; a non-empty result is a compiler bug."""
        errors = []
        for n, d in self._g.nodes(data=True):
            if not isinstance(d.get("payload"), ProblemNode) or d["payload"].name != n:
                errors.append(f"node {n!r} lacks a matching ProblemNode payload")
        for u, v, k, d in self._g.edges(keys=True, data=True):
            p = d.get("payload")
            ok = (isinstance(p, HierarchyEdge) and k == "hierarchy" and (p.upper, p.lower) == (u, v)) or \
                 (isinstance(p, DataflowEdge) and k == p.kind and (p.src, p.dst) == (u, v))
            if not ok:
                errors.append(f"edge {u!r}->{v!r} [{k}] has a payload that does not match it")
        return errors
