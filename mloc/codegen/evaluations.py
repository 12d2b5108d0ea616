"""train.py's evaluations: an `eval_N(p)` function per `eval` of the train block, the
`EVALUATIONS` table that lists them, and `SELECTION` (`checkpoint best on`, `stop when`).
Each returns lines of code; the emitter lays them out."""

from __future__ import annotations

from mloc.codegen.values import render_value
from mloc.frontend import ast


def functions(evals, problems: set[str], imports: set[str], at) -> list[list[str]]:
    """`eval_N(p)` per evaluation: its call, each data argument (one that is not a problem
    or a literal) passed through `p.data`, which puts it on the run's device and, in a
    `--dtype` run, casts it, as the batches are. The program's parameter is `p`, unless a
    problem or an import is called so: then `program` (a keyword, so it names neither)."""
    me = "program" if "p" in problems | imports else "p"
    out, explained = [], False
    for i, e in enumerate(evals):
        lines = []
        if not explained and any(_is_data(a.value, problems) for a in e.call.call.args):
            lines.append(f"# {me}.data(x): x as the batches are: on the run's device, floating tensors in its "
                         "--dtype (an iterable's batch by batch)")
            explained = True
        lines.append(f"def eval_{i}({me}):")
        lines += [f"    {name} = {me}.module({name!r})" for name in e.call.read_names()]
        lines.append(f"    return {_call(e.call.call, problems, me)}  {at(e.call.span)}")
        out.append(lines)
    return out


def _call(call: ast.Call, problems: set[str], me: str = "p") -> str:
    """An evaluation's call, its data arguments wrapped in `p.data(...)` (moved to the run's
    device and, under `--dtype`, cast, as the batches are:
    :meth:`mloc.runtime.engine.Program.data`); `me` is the name of the program's parameter."""
    args = []
    for a in call.args:
        value = render_value(a.value)
        if _is_data(a.value, problems):
            value = f"{me}.data({value})"
        args.append((f"{a.keyword.name}=" if a.keyword else "") + value)
    return f"{call.func.dotted}({', '.join(args)})"


def _is_data(value: ast.Value, problems: set[str]) -> bool:
    """Whether an argument is data the program's code makes or holds: a call, a name other
    than a problem's or `None` (`lib.TEST_SET`), or a list or tuple holding one."""
    match value:
        case ast.Call():
            return True
        case ast.Name():
            return value.dotted not in problems and value.dotted != "None"
        case ast.ListValue() | ast.TupleValue():
            return any(_is_data(v, problems) for v in value.items)
    return False


def table(evals, at) -> list[str]:
    """train.py's `EVALUATIONS`: (every, name, function, named) per evaluation."""
    if not evals:
        return ["EVALUATIONS = ()"]
    return ["# (every, name, function, named: a dict's keys become NAME.KEY)", "EVALUATIONS = (",
            *(f"    ({e.every}, {e.name!r}, eval_{i}, {e.named}),  {at(e.call.span)}" for i, e in enumerate(evals)),
            ")"]


def selection(t, at) -> list[str]:
    """`checkpoint best on` and `stop when` as train.py's `SELECTION` (read by
    mloc.runtime.selection); nothing when the program has neither."""
    if t.best is None and t.stop is None:
        return []
    best = None if t.best is None else dict(metric=t.best.metric, mode=t.best.mode)
    stop = None if t.stop is None else dict(metric=t.stop.metric, mode=t.stop.mode, patience=t.stop.patience,
                                            min_delta=t.stop.min_delta)
    spans = " ".join(at(x.span) for x in (t.best, t.stop) if x is not None)
    return [f"SELECTION = dict(best={best!r}, stop={stop!r})  {spans}"]
