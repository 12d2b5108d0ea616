"""Infer dataflow edges from the problems each loss names, and check they fit the hierarchy.

For each problem P and each problem Q that P's loss reads (or that P's `init` names):
Q above P gives a u2l edge Q -> P (Betty's upper-to-lower), Q below P an l2u edge, an
earlier stage of P's chain a `chain` edge. Anything else is an error (E210). Then every
hierarchy edge must carry dataflow (E209), an upper problem must read some problem below
it (E211), a lowest problem must read itself (E212), chain stages must read the stage
before (E505), a method whose descriptor does not `reads_init` cannot see an upper problem
that enters only through `init` (E403), a lower problem that `accumulate`s cannot be
unrolled by `itd` (E218, `auto` on an init-only edge included), and under `exact`
semantics a method below a middle level with feedback must be `differentiable` (E404). `auto` passes both: the planner
chooses `itd` for an init-only edge and `cg` under `exact` semantics.

The checks run on the declared structure and on every loss that resolved, so a mistake in
some other field of a problem hides none of them; edges are added to the graph only
between problems that made it into the graph.
"""

from __future__ import annotations

import networkx as nx

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.builtins.methods import ITD
from mloc.diagnostics import Diagnostics
from mloc.ir.graph import ProgramGraph
from mloc.ir.payloads import DataflowEdge, Read, ResolvedProgram
from mloc.passes.hierarchy import declared_hierarchy
from mloc.passes.sharding import check_sharded_settings


def _reads_init(method: str) -> bool:
    """Whether `method` carries a hypergradient through `init`; `auto` picks one that does."""
    caps = METHODS[method].caps
    return caps.reads_init or caps.planned


def _differentiable(method: str) -> bool:
    """Whether `method`'s BR-VJP can itself be differentiated, as `exact` semantics need below
    a middle level with feedback; `auto` picks one that can."""
    caps = METHODS[method].caps
    return caps.differentiable or caps.planned


def infer_dataflow(g: ProgramGraph, r: ResolvedProgram, uncertain: frozenset[str], diags: Diagnostics) -> None:
    h = declared_hierarchy(r)
    chain_pos = {s: (i, k) for k, grp in enumerate(r.chain_groups) for i, s in enumerate(grp)}
    for read in r.reads:
        if read.src not in h:
            continue               # an undefined name, already reported
        if read.src == read.dst:
            if read.via == "init":
                diags.error("E210", f"`{read.dst}` cannot start from its own parameters", read.span,
                            label="the problem itself",
                            help="name the upper problem whose parameters it should start from, e.g. `init = meta`")
            continue
        kind = _kind(h, chain_pos, read)
        if kind is None and not {read.src, read.dst} & uncertain:
            _unrelated(read, diags)
        elif kind is not None and read.src in g and read.dst in g:
            g.add_dataflow(DataflowEdge(read.src, read.dst, kind, read.via, read.span))
    _check_links(g, r, uncertain, diags)
    _check_problems(r, h, uncertain, diags)
    _check_vmap(g, diags)
    _check_sharded(g, diags)
    check_sharded_settings(g, r, diags)
    _check_chains(r, diags)
    if g.info.semantics == "exact":
        _check_exact(g, h, feedback_middles(r, h), diags)


def feedback_middles(r: ResolvedProgram, h: nx.DiGraph) -> dict[str, str]:
    """Middle problems (with uppers) whose loss reads a problem below them: there, `exact`
    and `per_edge` hypergradients differ. Maps each to one problem it reads below it."""
    out = {}
    for m in r.names:
        if not any(True for _ in h.predecessors(m)):
            continue
        below = nx.descendants(h, m)
        read = sorted(rd.src for rd in r.reads_of(m) if rd.via == "loss" and rd.src in below)
        if read:
            out[m] = read[0]
    return out


def _check_exact(g: ProgramGraph, h: nx.DiGraph, middles: dict[str, str], diags: Diagnostics) -> None:
    for m, reads in middles.items():
        region = {m} | nx.descendants(h, m)
        for edge in g.hierarchy_edges():
            if edge.upper in region and not _differentiable(edge.method.name):
                diags.error("E404", f"`{edge.method.name}` cannot be differentiated, but `exact` semantics "
                            f"differentiate the best response below `{m}`, whose loss reads `{reads}`",
                            edge.method.span, label="not differentiable",
                            help="use `cg(...)`, `neumann(...)` or `first_order` on this edge, or set "
                                 "`semantics = per_edge` (Betty's approximation)")


def _kind(h: nx.DiGraph, chain_pos: dict, read: Read) -> str | None:
    q, p = read.src, read.dst
    if nx.has_path(h, q, p):
        return "u2l"
    if read.via == "loss" and nx.has_path(h, p, q):
        return "l2u"
    if read.via == "loss" and q in chain_pos and p in chain_pos:
        (iq, cq), (ip, cp) = chain_pos[q], chain_pos[p]
        if cq == cp and iq < ip:
            return "chain"
    return None


def _unrelated(read: Read, diags: Diagnostics) -> None:
    p, q = read.dst, read.src
    if read.via == "init":
        diags.error("E210", f"`{p}` starts from `{q}`'s parameters, but `{q}` is not above `{p}`",
                    read.span, help=f"declare `{q} -> {p}`")
        return
    diags.error("E210", f"the loss of `{p}` reads `{q}`, which is neither above nor below it",
                read.span, label="unrelated problem",
                help=f"declare `{q} -> {p}` if `{q}` should be tuned through `{p}`, or remove `{q}` from the loss")


def _check_links(g: ProgramGraph, r: ResolvedProgram, uncertain: frozenset[str], diags: Diagnostics) -> None:
    for link in r.links:
        if link.lower not in r.readers or {link.upper, link.lower} & uncertain:
            continue
        if not any(rd.src == link.upper for rd in r.reads_of(link.lower)):
            diags.error("E209", f"`{link.upper}` sits above `{link.lower}`, but `{link.lower}` never "
                        f"reads `{link.upper}`", link.span,
                        help=f"pass `{link.upper}` to the loss of `{link.lower}`, or set "
                             f"`init = {link.upper}` in `{link.lower}` (MAML)")
    for edge in g.hierarchy_edges():
        reads = r.reads_of(edge.lower)
        via_loss = any(rd.src == edge.upper and rd.via == "loss" for rd in reads)
        via_init = any(rd.src == edge.upper and rd.via == "init" for rd in reads)
        if via_init and not via_loss and not _reads_init(edge.method.name):
            diags.error("E403", f"`{edge.method.name}` cannot carry a hypergradient to `{edge.upper}`: "
                        f"`{edge.lower}` reads it only through `init`", edge.method.span,
                        help="use `itd(...)` (MAML), `first_order`, or read the upper problem in "
                             "the loss (a proximal term, as iMAML does)")
        caps, low = METHODS[edge.method.name].caps, g.problem(edge.lower)
        if low.accumulate > 1 and (caps.unrolls or (caps.planned and via_init and not via_loss)):
            method = ITD.name if caps.planned else f"`{edge.method.name}`"
            diags.error("E218", f"`{edge.lower}` accumulates {low.accumulate} micro-steps per step, but "
                        f"{method} unrolls its steps on one batch each" +
                        (" (`auto` picks itd: the upper enters only through `init`)" if caps.planned else ""),
                        edge.span, help=f"use another method on this edge, or drop `accumulate` from `{edge.lower}`")


def _check_vmap(g: ProgramGraph, diags: Diagnostics) -> None:
    """`vmap = true` vectorizes a meta-batch (:mod:`mloc.runtime.grad.metabatch`): k independent
    solves of one lower problem, each from its own restart, differentiated by a method
    that vmaps, with a functional optimizer and no per-step stage besides it (E219)."""
    for node in g.problems():
        if node.vmap is None:
            continue
        lowers = g.lowers(node.name)
        why, help = _vmap_obstacle(g, node, lowers)
        if why:
            diags.error("E219", f"`vmap = true` cannot apply to `{node.name}`: {why}", node.vmap,
                        help=help or "drop `vmap` (the tasks are then solved one after another)")


def _check_sharded(g: ProgramGraph, diags: Diagnostics) -> None:
    """`strategy = fsdp` shards every module (:mod:`mloc.runtime.base.fsdp`): each edge's
    method must say so in the registry (`MethodCaps.shards`; its `unsharded_reason` is the
    message). `auto` is the planner's to resolve among those that shard, except where only
    itd applies (the upper enters only through `init`) (E220)."""
    if g.info.train.strategy != "fsdp":
        return
    able = _either(n for n, d in METHODS.items() if d.caps.shards)
    for edge in g.hierarchy_edges():
        name, caps = edge.method.name, METHODS[edge.method.name].caps
        low = g.problem(edge.lower)
        if caps.planned and low.init is not None and low.init[0] == edge.upper \
                and edge.upper not in low.loss.read_names():      # the planner's `auto` picks itd here
            name, caps = "auto", METHODS["itd"].caps
        if caps.unsharded_reason and not caps.planned:
            said = "`auto` (itd: the upper enters only through `init`)" if name == "auto" else f"`{name}`"
            diags.error("E220", f"{said} on `{edge.upper} -> {edge.lower}` cannot run under "
                        f"`strategy = fsdp`: {caps.unsharded_reason}", edge.span,
                        help=f"use {able} on this edge, or `strategy = zero` (sharded optimizer state, "
                             "whole modules)")


def _vmap_obstacle(g: ProgramGraph, node, lowers) -> tuple[str | None, str | None]:
    if node.accumulate < 2:
        return "it has no meta-batch (`accumulate` is 1)", f"set `accumulate = k` (k tasks) in `{node.name}`"
    if len(lowers) != 1:
        return (f"it has {len(lowers)} lower problems; a vectorized meta-batch solves exactly one",
                None)
    low = g.problem(lowers[0])
    if g.lowers(low.name):
        return f"`{low.name}` has lower problems of its own (two levels only)", None
    if low.init is None and low.reinit is False:
        return (f"`{low.name}` does not start again at each micro-step, so its tasks are not "
                "independent", f"give `{low.name}` `init = {node.name}` or `reinit = true`")
    edge = next(e for e in g.hierarchy_edges() if e.lower == low.name)
    if not METHODS[edge.method.name].caps.task_vmap:
        able = _either(n for n, d in METHODS.items() if d.caps.task_vmap)
        return (f"`{edge.method.name}` on `{node.name} -> {low.name}` does not vectorize",
                f"use {able} on that edge, or drop `vmap`")
    if not OPTIMIZERS[low.optimizer.name].caps.task_vmap:
        able = _either(n for n, d in OPTIMIZERS.items() if d.caps.task_vmap)
        return (f"`{low.name}`'s optimizer does not run under vmap (only {able} do)",
                f"use {able} there, or drop `vmap`")
    for field in ("schedule", "clip_grad_norm", "project"):
        if getattr(low, field) is not None:
            return (f"`{low.name}` has `{field}`, a stage of its own steps the vectorized solve "
                    "does not run", f"drop `{field}` from `{low.name}`, or drop `vmap`")
    if low.accumulate > 1:
        return f"`{low.name}` accumulates its own steps", None
    return None, None


def _either(names) -> str:
    """`a`, `b` or `c`."""
    names = [f"`{n}`" for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _check_problems(r: ResolvedProgram, h: nx.DiGraph, uncertain: frozenset[str], diags: Diagnostics) -> None:
    for name in r.names:
        if name not in r.readers or name in uncertain:
            continue
        reads = r.reads_of(name)
        read = {rd.src for rd in reads if rd.via == "loss"}
        below = nx.descendants(h, name)
        if below and not read & below:
            them = f"`{next(iter(below))}`" if len(below) == 1 else "any of them"
            diags.error("E211", f"`{name}` sits above {_list(below)}, but its loss does not read {them}",
                        r.loss_spans[name],
                        help=f"pass a problem below it to its loss, e.g. `{sorted(below)[0]}`")
        elif not below and name not in read:
            diags.error("E212", f"the loss of `{name}` never reads `{name}`, so its optimizer has "
                        "nothing to train", r.loss_spans[name], **_nothing_to_train_help(r, h, name, read))


def _nothing_to_train_help(r: ResolvedProgram, h: nx.DiGraph, name: str, read: set[str]) -> dict:
    """A lowest problem that reads only its upper `u`, while `u`'s loss reads both: the
    arrow is most likely reversed (`u -> name` written for `name -> u`), and passing
    `name` to its loss would hide the mistake rather than fix it."""
    for u in sorted(h.predecessors(name)):
        u_reads = {rd.src for rd in r.reads_of(u) if rd.via == "loss"}
        if u in read and {u, name} <= u_reads:
            return dict(help=f"the edge looks reversed: write `{name} -> {u}` (upper -> lower: the "
                             f"lower problem `{u}` trains on a loss that reads the upper `{name}`)",
                        notes=(f"`{u} -> {name}` makes `{name}` the lower problem, but `{u}`'s loss "
                               f"reads `{u}` and `{name}` while `{name}`'s reads only `{u}`",))
    return dict(help=f"pass `{name}` to its loss")


def _check_chains(r: ResolvedProgram, diags: Diagnostics) -> None:
    for group in r.chain_groups:
        for prev, stage in zip(group, group[1:]):
            if stage in r.readers and not any(rd.src == prev for rd in r.reads_of(stage)):
                diags.error("E505", f"stage `{stage}` follows `{prev}` in the chain, but its loss does "
                            f"not read `{prev}`", r.loss_spans[stage],
                            help=f"pass `{prev}` to the loss of `{stage}`: its features are this stage's input")


def _list(names) -> str:
    names = sorted(names)
    return ", ".join(f"`{n}`" for n in names[:3]) + (" ..." if len(names) > 3 else "")
