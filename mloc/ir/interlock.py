"""The program graph's interlocking chains as :class:`~mloc.shared.interlock.Interlock`
values (who trains whom; read by the graph printer, the planner and the schedule)."""

from __future__ import annotations

from mloc.shared.interlock import Interlock


def chains_of(g) -> tuple[Interlock, ...]:
    """The program's chains (a :class:`~mloc.ir.graph.ProgramGraph`'s `info.chains`)."""
    return tuple(Interlock(tuple(c.stages), c.interlock, c.monitor) for c in g.info.chains)
