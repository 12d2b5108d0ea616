"""The step schedule: who steps when, within one outer step (the planner's last decision).

Periods count lowest-level micro-steps: 1 at the bottom; above, the largest of `unroll` ×
the lower's period over its edges (an `itd` edge's unrolled steps happen inside the upper's
hypergradient: factor 1), times the problem's own `accumulate`. Each level repeats the one
below `period ratio` times, then steps its own problems, lowest first. A problem that
starts again at each step of its upper (`init`, `reset`) is reset at the start of that
step; a problem with `accumulate = k` takes k micro-steps, each after everything below it
in one of its steps (its lowers' resets and steps: a meta-batch of k lower solves), and one
optimizer step on their mean (`apply`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mloc.builtins import METHODS
from mloc.ir.graph import ProgramGraph
from mloc.ir.interlock import chains_of
from mloc.shared.compile import CAPTURED, RULE


@dataclass(frozen=True)
class Action:
    """One line of the schedule: `kind` is lower_step, upper_step, draw, reset, commit,
    accumulate (one micro-step's gradient, added up), apply (the optimizer step on the
    mean of the accumulated micro-steps), meta_batch (`count` tasks of `steps` lower
    steps each, vectorized, and the step on their mean) or chain_step (one interlocking step of the chain
    whose first stage is `problem`)."""

    kind: str
    problem: str
    count: int = 1
    note: str = ""
    steps: int = 0      # meta_batch: the lower problem's steps per task


@dataclass(frozen=True)
class Loop:
    repeat: int
    body: tuple["Action | Loop", ...]
    note: str = ""


def periods_of(g: ProgramGraph, edges) -> dict[str, int]:
    """Lowest-level micro-steps per step of each problem (see the module docstring)."""
    periods: dict[str, int] = {}
    for name in reversed(g.topological_order()):
        below = [periods[e.lower] * (1 if METHODS[e.method].caps.unrolls else e.unroll)
                 for e in edges if e.upper == name]
        periods[name] = max(below, default=1) * g.problem(name).accumulate
    return periods


def schedule_of(g: ProgramGraph, edges, periods: dict[str, int]) -> Loop:
    """Nested loops by period: each level repeats the one below `period ratio` times, then
    steps its own problems (lower ones first). An accumulating problem's k micro-steps each
    take 1/k of that (its meta-batch); where the ratio does not divide by k (another
    problem's levels in between), its micro-steps run back to back after them."""
    itd_into = {e.lower: e for e in edges if METHODS[e.method].caps.unrolls}
    order = list(reversed(g.topological_order()))          # lowest first
    body: tuple = ()
    previous = None
    for p in sorted(set(periods.values())):
        names = [n for n in order if periods[n] == p]
        ratio = p // previous if previous is not None else 1
        acc = next((n for n in names if g.problem(n).accumulate > 1
                    and ratio % g.problem(n).accumulate == 0), None)
        k = g.problem(acc).accumulate if acc else 1
        inner: list = [Action("reset", n, note=_reset_note(g.problem(n)))
                       for n in order if _reset_period(g, n, periods) == p]
        if previous is not None:
            inner.append(Loop(ratio // k, body, f"{ratio // k} step(s) of the level below"))
        after: list = []
        for name in names:
            steps = _actions(g, name, itd_into, edges, micro=name == acc)
            (after if acc and names.index(name) > names.index(acc) else inner).extend(steps)
        if acc:
            inner = _vectorized(g, acc, k, inner) or [
                Loop(k, tuple(inner), f"accumulate: {k} micro-steps of `{acc}`"),
                Action("apply", acc, note=f"one step on the mean of the {k}")]
            inner += after
        body, previous = tuple(inner), p
    return Loop(1, body)


def _vectorized(g: ProgramGraph, acc: str, k: int, micro: list) -> list | None:
    """`acc`'s meta-batch as one `meta_batch` action (`vmap = true`), when its micro-step is
    exactly: reset the lower, its steps, the micro-step (else None: the loop form)."""
    if g.problem(acc).vmap is None or len(micro) != 3:
        return None
    reset, steps, step = micro
    lower = g.lowers(acc)[0]
    if (reset, step) != (Action("reset", lower, note=reset.note), Action("accumulate", acc, note=step.note)) \
            or not isinstance(steps, Loop) or steps.body != (Action("lower_step", lower),):
        return None
    return [Action("meta_batch", acc, k, f"{k} tasks of {steps.repeat} `{lower}` steps each, "
                   f"vectorized (vmap), then one step on their mean", steps=steps.repeat)]


def _reset_period(g: ProgramGraph, name: str, periods: dict[str, int]) -> int | None:
    """The level whose every step starts with `name`'s reset: an `init` or `reinit` problem
    starts again once per step of its upper (the lowest-period one), before its own steps
    of that step; None without either."""
    if not _restarts(g.problem(name)):
        return None
    return max(periods[name], min((periods[u] for u in g.uppers(name)), default=periods[name]))


def _restarts(node) -> bool:
    """It starts again at each step of its upper (`init` or `reinit`): unrolled steps are
    not committed, a reset opens each of those steps."""
    return node.init is not None or node.reinit is not False


def _reset_note(node) -> str:
    if node.init is not None:
        return f"start from `{node.init[0]}`'s weights"
    if node.reinit is True:
        return "start again from its initial weights"
    return f"start again: `{node.reinit.text}`"


def _actions(g: ProgramGraph, name: str, itd_into: dict, edges, micro: bool = False) -> list:
    """`name`'s actions in its level: its step (as one micro-step when ``micro``; back to
    back micro-steps when it accumulates and is not interleaved), then the commits of its
    `itd` lowers."""
    chain = next((c for c in chains_of(g) if name in c.stages), None)
    if chain is not None:   # one step of the whole chain, where its first stage would step
        return [Action("chain_step", name, note=f"{chain.policy()} over " + ", ".join(chain.stages))] \
            if name == chain.stages[0] else []
    lowers = g.lowers(name)
    k = g.problem(name).accumulate
    out: list = []
    if micro or k > 1:
        what = Action("accumulate", name, note="one micro-step, added up")
        out += [what] if micro else [Loop(k, (what,), f"accumulate: {k} micro-steps"),
                                     Action("apply", name, note=f"one step on the mean of the {k}")]
    elif not lowers:
        if name in itd_into:
            out.append(Action("draw", name, note=f"its {itd_into[name].unroll} steps are unrolled by `itd`"))
        else:
            out.append(Action("lower_step", name))
    else:
        out.append(Action("upper_step", name, note="hypergradient through " + ", ".join(lowers)))
    commits = [Action("commit", low, e.unroll, "take the unrolled steps for real")
               for low in lowers for e in [itd_into.get(low)]
               if e is not None and e.upper == name and not _restarts(g.problem(low))]
    if commits and out[-1].kind == "upper_step":
        # the unrolled steps are taken for real with the upper's parameters they were
        # differentiated at: after its hypergradient, before its optimizer step
        return [Action("accumulate", name, note=out[-1].note), *commits,
                Action("apply", name, note="its optimizer step")]
    return out + commits


def schedule_json(loop: Loop) -> list:
    out = []
    for item in loop.body:
        if isinstance(item, Loop):
            out.append({"repeat": item.repeat, "body": schedule_json(item)})
        else:
            out.append({"action": item.kind, "problem": item.problem, "count": item.count,
                        **({"steps": item.steps} if item.steps else {})})
    return out


def schedule_lines(loop: Loop, depth: int) -> list[str]:
    out = []
    for item in loop.body:
        if isinstance(item, Loop):
            out.append("  " * depth + f"repeat {item.repeat}:")
            out += schedule_lines(item, depth + 1)
        else:
            times = f" x{item.count}" if item.count > 1 else ""
            out.append("  " * depth + f"{item.kind} {item.problem}{times}" + (f"   ({item.note})" if item.note else ""))
    return out


def compile_lines(schedule: Loop) -> list[str]:
    """What `--compile on` captures of the schedule (an upper step under `--nproc` with its
    averaging in its graph) and `auto`'s rule (:mod:`mloc.shared.compile`)."""
    kinds: dict[str, list[str]] = {}

    def walk(loop) -> None:
        for item in loop.body:
            if isinstance(item, Loop):
                walk(item)
            elif item.problem not in kinds.setdefault(item.kind, []):
                kinds[item.kind].append(item.problem)
    walk(schedule)
    captured = [f"{k} {', '.join(ps)}" for k, ps in kinds.items() if k in CAPTURED]
    nproc = (" (under --nproc an upper step's averaging runs in its graph, as functional collectives)"
             if "upper_step" in kinds else "")
    fused = "lower_step" in kinds or "upper_step" in kinds
    commits = (", each with its optimizer update in the graph where it fuses (else the commit compiled apart)"
               if fused else ", and every optimizer commit")
    return ["compiled steps (--compile on): " + ("; ".join(captured) if captured else "none")
            + commits + nproc, f"  {RULE}"]
