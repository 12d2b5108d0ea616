"""train.py's evaluations: an `eval_N(p)` function per `eval` of the train block, the
declaration's `evaluations` that list them, and its `best` and `stop` (`checkpoint best
on`, `stop when`). Each returns lines of code; the emitter lays them out."""

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
    :meth:`mloc.runtime.program.engine.Program.data`); `me` is the name of the program's parameter."""
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
    """The declaration's `evaluations`: an `Evaluation(every, name, function)` per
    evaluation (none: nothing)."""
    if not evals:
        return []
    return ["    evaluations=(  # named: a dict's keys become NAME.KEY",
            *(f"        Evaluation({e.every}, {e.name!r}, eval_{i}{', named=True' if e.named else ''}),  "
              f"{at(e.call.span)}" for i, e in enumerate(evals)),
            "    ),"]


def selection(t, at) -> list[str]:
    """`checkpoint best on` and `stop when` as the declaration's `best` and `stop`
    (followed by mloc.runtime.run.selection); nothing when the program has neither."""
    out = []
    if t.best is not None:
        out.append(f"    best=Criterion({t.best.metric!r}, {t.best.mode!r}),  {at(t.best.span)}")
    if t.stop is not None:
        s = t.stop
        out.append(f"    stop=Criterion({s.metric!r}, {s.mode!r}, patience={s.patience!r}, min_delta={s.min_delta!r}),"
                   f"  {at(s.span)}")
    return out
