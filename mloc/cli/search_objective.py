"""What a model-based search optimizes: one evaluation metric of the program, in one
direction, read from its runs. No torch here.

**Which metric** (:func:`objective_of`): ``--metric NAME --direction min|max`` when given;
else the metric the program ranks its runs by: the one of ``checkpoint best on max|min
METRIC``, else of ``stop when [max|min] METRIC ...`` (the direction written at one of the
two); else its first evaluation whose name says a direction (:func:`mloc.cli.experiments.mode_by_name`:
``test_loss`` is ``min``), as `mloc runs` and the sweep's table rank it. A program with
none of these needs ``--metric``.

**Its value** (:func:`value_of`): the best evaluation of the metric over the run, in that
direction (NaN never best), as ``checkpoint best`` keeps it: a run is judged by its best
state, the one ``best.pt`` holds and ``stop when`` waits for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mloc.cli.output import UsageError


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str              # "min" or "max"
    why: str               # "--metric", "checkpoint best", "stop when" or "by name"

    def better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b


def objective_of(file: str, point: tuple[str, ...], metric: str | None, direction: str | None) -> Objective:
    """The objective of the program ``file`` with the ``--set``s of ``point`` spliced in."""
    if metric and direction:
        return Objective(metric, direction, "--metric")
    declared, evals = _declared(file, point)
    if metric:
        from mloc.cli.experiments import mode_by_name
        mode = declared.get(metric) or mode_by_name(metric)
        if mode is None:
            raise UsageError(f"--metric {metric}: the program declares no direction for it and its name says none",
                             help="add --direction min or --direction max")
        return Objective(metric, mode, "declared" if metric in declared else "by name")
    if declared:
        name, mode = next(iter(declared.items()))
        return Objective(name, direction or mode, "declared")
    from mloc.cli.experiments import mode_by_name
    for name in evals:
        if mode_by_name(name):
            return Objective(name, direction or mode_by_name(name), "by name")
    raise UsageError(f"{file} declares nothing to optimize: no `checkpoint best on max|min METRIC`, no `stop when`, "
                     "and no evaluation whose name says a direction",
                     help="name it: --metric NAME --direction min|max (NAME: an evaluation of the program)")


def _declared(file: str, point: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """``({metric: mode} as `checkpoint best` then `stop when` declare it, [evaluation
    names])`` from the train block of ``file`` with ``point`` spliced in."""
    from mloc.codegen.compile import with_overrides
    from mloc.diagnostics import DiagnosticError
    from mloc.frontend import ast
    from mloc.frontend.parse import parse
    try:
        module = parse(with_overrides(file, point).source)
    except DiagnosticError:
        return {}, []             # the runs report the program's errors themselves
    entries = [e for t in module.of_type(ast.Train) for e in t.body.entries]
    watched = [e for e in entries if isinstance(e, ast.Watch)] + [e for e in entries if isinstance(e, ast.Stop)]
    modes = {e.metric.dotted: e.mode.name for e in watched if e.mode is not None}
    declared = {e.metric.dotted: modes[e.metric.dotted] for e in watched if e.metric.dotted in modes}
    evals = [e.name.name if e.name else e.value.func.parts[-1] for e in entries
             if isinstance(e, ast.Every) and e.kind.name == "eval" and isinstance(e.value, ast.Call)]
    return declared, evals


def evaluations(path: Path, metric: str, offset: int = 0) -> tuple[list[tuple[int, float]], int]:
    """The ``(step, value)`` evaluations of ``metric`` in the whole lines of the metrics
    file ``path`` from byte ``offset`` on, and the offset after the last whole line read
    (a line being written is read at the next call). A missing file has none."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    found = []
    for line in data[:end].splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("kind") == "eval" and r.get("eval") == metric \
                and isinstance(r.get("value"), (int, float)) and isinstance(r.get("step"), int):
            found.append((r["step"], float(r["value"])))
    return found, offset + end


def value_of(run_dir: Path, objective: Objective) -> float | None:
    """The run's best evaluation of the objective's metric (module docstring); None without one."""
    values = [v for _, v in evaluations(Path(run_dir) / "metrics.jsonl", objective.metric)[0] if not math.isnan(v)]
    if not values:
        return None
    return min(values) if objective.mode == "min" else max(values)
