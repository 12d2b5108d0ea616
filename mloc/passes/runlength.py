"""Runs shorter than a schedule: `--steps N` (or the train block's `steps`) that stops a
problem before its learning-rate schedule ends is a warning (W105), at the schedule.

A problem takes `periods[top] / periods[p]` optimizer steps per outer step (the planner's
periods count lowest-level steps; see `mloc.passes.schedule`), so N outer steps give it
`N * periods[top] / periods[p]` steps. A schedule with `total` (cosine, linear) that is
longer, or a `multistep` whose last milestone is later, never finishes: the learning rate
stays above where the schedule would take it. A problem that starts again at each step of
its upper (`init`, `reinit`) is left out: its step count restarts too.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostic
from mloc.ir.graph import ProgramGraph


def _length(schedule) -> tuple[int, str] | None:
    """(the steps the schedule spans, what they are called), or None when it has no end."""
    args = dict(schedule.args)
    if isinstance(args.get("total"), int):
        return args["total"], f"`total={args['total']}`"
    milestones = args.get("milestones")
    if milestones:
        return int(milestones[-1]), f"its last milestone, {milestones[-1]}"
    return None


def short_schedules(g: ProgramGraph, periods: dict[str, int], steps: int, given: str) -> list[Diagnostic]:
    """W105 for each problem whose schedule is longer than `steps` outer steps give it;
    `given` says where `steps` comes from, e.g. `--steps 200`."""
    top = max(periods.values(), default=1)
    out = []
    for p in g.problems():
        if p.schedule is None or p.init is not None or p.reinit is not False or p.name not in periods:
            continue
        length = _length(p.schedule)
        taken = steps * top // max(periods[p.name], 1)
        if length is None or taken >= length[0]:
            continue
        per = "" if taken == steps else f" ({top // periods[p.name]} per outer step)"
        out.append(Diagnostic(
            "W105", f"`{p.name}`'s schedule spans {length[0]} of its steps, but {given} gives it {taken}{per}",
            p.schedule.span, label=f"{length[1]}: the run ends before the schedule does",
            help=f"run at least {-(-length[0] * periods[p.name] // top)} outer steps, or shorten the schedule "
                 f"for this run: --set '{p.name}.schedule.{'total' if 'total' in dict(p.schedule.args) else 'milestones'}=...'"))
    return out
