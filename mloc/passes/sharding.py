"""`strategy = fsdp` and the rest of the program (E221): the settings a sharded run cannot
take, from :func:`mloc.shared.sharding.refusals` (the one home of the rules, which the
runtime applies to `--strategy fsdp` as well). The methods themselves are E220's
(:mod:`mloc.passes.dataflow`)."""

from __future__ import annotations

from mloc.diagnostics import Diagnostics
from mloc.ir.graph import ProgramGraph
from mloc.ir.payloads import ResolvedProgram
from mloc.shared.sharding import ProblemFacts, refusals


def check_sharded_settings(g: ProgramGraph, r: ResolvedProgram, diags: Diagnostics) -> None:
    """E221 for each setting of a `strategy = fsdp` program that shards cannot run, at the
    problem it belongs to (the train block for program-wide ones)."""
    train = g.info.train
    if train.strategy != "fsdp":
        return
    edges = list(g.hierarchy_edges())
    spans = {}
    facts = []
    for node in g.problems():
        spans[f"`{node.name}`"] = node.name_span
        facts.append(ProblemFacts(
            node.name, node.optimizer.name,
            lowers=tuple(e.lower for e in edges if e.upper == node.name),
            uppers=tuple(e.upper for e in edges if e.lower == node.name),
            precision=node.precision or train.precision, clip=node.clip_grad_norm is not None,
            init=node.init is not None, reinit=node.reinit is not False, project=node.project is not None,
            accumulate=node.accumulate > 1 or node.vmap is not None))
    for why, help in refusals(tuple(facts), chains=bool(r.chain_groups)):
        span = spans.get(why.split(":", 1)[0], train.span)
        diags.error("E221", f"`strategy = fsdp` cannot run this: {why}", span, help=help)
