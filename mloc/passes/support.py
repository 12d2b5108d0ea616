"""Constructs the checker accepts but the runtime cannot execute, and the chain rules that
need the whole graph.

Today: an interlocking chain one of whose stages is also in a hierarchy (a problem above
it tuning it, or below it). `mloc check` reports each as a warning (W103), so a program
that checks clean does not first fail at `mloc run`; the compile pipeline's `support`
pass reports the same constructs as errors (E704) before any code is made. A built-in
without a runtime is E704 earlier, at `mloc check`, where its call is resolved.

Why a chain in a hierarchy cannot run: an upper problem's hypergradient differentiates
the lower problem's best response, the point where the lower's gradient vanishes (implicit
methods) or the trajectory of its gradient steps (unrolled ones). The stages of an
interlocking chain follow no gradient of one objective: stage k descends l_t(k) while its
head descends l_k, a truncated, non-symmetric update field whose fixed point no best-
response method of mloc differentiates. A chain is therefore a lowest level of its own.

The support pass also checks what a chain step needs of its stages' fields (E708): they
read one batch, so their `data` must be one call.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostic
from mloc.ir.graph import ProgramGraph

_WHAT = "a stage of an interlocking chain cannot also be in a hierarchy"
_WHY = ("an upper problem's hypergradient differentiates its lower problem's best response, but an "
        "interlocking chain's stages follow truncated gradients of different losses, not the gradient "
        "of one objective; train the chain on its own, or tune it with a plain hierarchy "
        "(drop the `chain` block, whose stages then train end to end)")


def _in_hierarchy(g: ProgramGraph):
    """(chain, stage, the edge) for each chain with a stage that a hierarchy edge touches."""
    out = []
    for c in g.info.chains:
        edge = next((e for e in g.hierarchy_edges() if {e.upper, e.lower} & set(c.stages)), None)
        if edge is not None:
            out.append((c, edge.lower if edge.lower in c.stages else edge.upper, edge))
    return out


def unsupported(g: ProgramGraph) -> list[Diagnostic]:
    """One E704 per construct of `g` that cannot run, at its span; E708 per chain whose
    stages' data differ."""
    out = [Diagnostic("E704", f"{_WHAT}: `{s}` is in the hierarchy edge {e.upper} -> {e.lower}", c.span,
                      help=_WHY) for c, s, e in _in_hierarchy(g)]
    for c in g.info.chains:
        first = g.problem(c.stages[0]).data
        other = next((g.problem(s) for s in c.stages[1:] if g.problem(s).data.text != first.text), None)
        if other is not None:
            out.append(Diagnostic("E708", f"the stages of a chain read one batch, but `{other.name}`'s data "
                                  f"differs from `{c.stages[0]}`'s", other.data.span, label="another stream",
                                  help=f"write `data = {first.text}` in every stage of the chain: a chain step "
                                       f"draws its first stage's next batch and every stage's loss reads it"))
    return out


def cannot_run_yet(g: ProgramGraph) -> list[Diagnostic]:
    """The constructs `unsupported` reports as E704, as W103 warnings for `mloc check`."""
    return [Diagnostic("W103", f"{_WHAT}: `mloc run` and `mloc compile` stop here (E704)", c.span,
                       label="checked, cannot run", help=_WHY) for c, _, _ in _in_hierarchy(g)]
