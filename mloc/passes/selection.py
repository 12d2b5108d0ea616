"""The train block's model selection: `checkpoint best on ...` and `stop when ...`, checked.

    checkpoint best on max acc                                   keep best.pt where acc was highest
    stop when min loss has not improved by 0.001 for 5 evals     early stopping

A metric is an evaluation's name (`eval acc every 500 = ...`; unnamed, the called
function's name), or `NAME.KEY` for a named evaluation that returns a dict. Whether higher
or lower is better is said once, at either use: `max` or `min` before the metric; a metric
with no mode at any use, or with two different ones, is E604. A metric no evaluation can
produce is E603 (with a did-you-mean over the evaluations' names); when an unnamed
evaluation might return a dict holding it, the check waits for the compile-time trial of
the evaluations (`mloc.passes.evaluations`), which knows every metric's name.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import EvalSpec, StopSpec, WatchSpec
from mloc.lang.types import INVALID, Float, Int

_UNITS = ("evals", "eval", "evaluations")


def resolve_selection(block: ast.Block, evals: tuple[EvalSpec, ...], diags: Diagnostics) -> dict:
    """{"best": WatchSpec | None, "stop": StopSpec | None} from the block's entries."""
    watches = [e for e in block.entries if isinstance(e, ast.Watch) and _watch_words(e, diags)]
    stops = [e for e in block.entries if isinstance(e, ast.Stop) and _stop_words(e, diags)]
    watches = _single(watches, "`checkpoint best`", diags)
    stops = _single(stops, "`stop when`", diags)
    uses = [*watches, *stops]
    known = [u for u in uses if _metric_known(u, evals, diags)]
    modes = _modes(uses, diags)
    out: dict = {"best": None, "stop": None}
    for w in watches:
        if w in known and w.metric.dotted in modes:
            out["best"] = WatchSpec(w.metric.dotted, modes[w.metric.dotted], w.metric.span)
    for s in (e for e in block.entries if isinstance(e, ast.Stop)):
        patience = Int(1).check(s.patience, "the patience of `stop when`", diags)
        delta = 0.0 if s.min_delta is None else Float(0).check(s.min_delta, "the `by` of `stop when`", diags)
        if s in stops and s in known and s.metric.dotted in modes and INVALID not in (patience, delta):
            out["stop"] = StopSpec(s.metric.dotted, modes[s.metric.dotted], patience, float(delta), s.metric.span)
    return out


def _single(entries: list, what: str, diags: Diagnostics) -> list:
    for extra in entries[1:]:
        diags.error("E103", f"{what} is given twice in the train block", extra.span, label="second one",
                    notes=(f"first given at {entries[0].span}",), help="keep one of them")
    return entries[:1]


def _watch_words(w: ast.Watch, diags: Diagnostics) -> bool:
    if w.kind.name != "checkpoint":
        diags.error("E601", f"unknown action `{w.kind.name} {w.what.name} on ...`", w.kind.span,
                    help="did you mean `checkpoint best on max METRIC`?")
        return False
    if w.what.name != "best":
        diags.error("E601", f"`checkpoint {w.what.name} on ...` is not an action", w.what.span,
                    help="write `checkpoint best on max METRIC` (or `min`) to keep the best state")
        return False
    return True


def _stop_words(s: ast.Stop, diags: Diagnostics) -> bool:
    ok = True
    if s.kind.name != "stop":
        diags.error("E601", f"unknown action `{s.kind.name} when ...`", s.kind.span,
                    help="did you mean `stop when max METRIC has not improved for N evals`?")
        ok = False
    if s.unit.name not in _UNITS:
        diags.error("E304", f"patience is counted in evaluations, not `{s.unit.name}`", s.unit.span,
                    label="expected `evals`",
                    help="write `for N evals`: N evaluations of the metric in a row without improvement")
        ok = False
    return ok


def _metric_known(use: ast.Watch | ast.Stop, evals: tuple[EvalSpec, ...], diags: Diagnostics) -> bool:
    """False after E603 when no evaluation can produce the metric (see the module docstring)."""
    metric = use.metric.dotted
    if not evals:
        diags.error("E603", f"`{metric}` is not a metric: the train block has no evaluation", use.metric.span,
                    label="nothing evaluates this",
                    help=f"add one, e.g. `eval {metric.split('.')[0]} every 500 = lib.accuracy(model, lib.test_data())`")
        return False
    if any(metric == e.name or (e.named and metric.startswith(e.name + ".")) for e in evals):
        return True
    if any(not e.named for e in evals):
        return True              # an unnamed evaluation may return a dict holding it: the trial tells
    names = [e.name for e in evals]
    diags.error("E603", f"no evaluation is named `{metric}`", use.metric.span, label="unknown metric",
                help=did_you_mean(metric, names) or "metrics: " + ", ".join(f"`{n}`" for n in names))
    return False


def _modes(uses: list, diags: Diagnostics) -> dict[str, str]:
    """{metric: "max" | "min"} for the metrics whose mode is said, once or consistently."""
    said: dict[str, ast.Ident] = {}
    bad: set[str] = set()
    for u in uses:
        metric = u.metric.dotted
        if u.mode is None:
            continue
        first = said.setdefault(metric, u.mode)
        if first.name != u.mode.name:
            diags.error("E604", f"`{metric}` is maximized here but minimized elsewhere" if u.mode.name == "max"
                        else f"`{metric}` is minimized here but maximized elsewhere", u.mode.span,
                        notes=(f"`{first.name}` at {first.span}",), help="say one direction for a metric")
            bad.add(metric)
    for u in uses:
        metric = u.metric.dotted
        if metric not in said and metric not in bad:
            bad.add(metric)
            diags.error("E604", f"say whether a higher or a lower `{metric}` is better", u.metric.span,
                        label="max or min?",
                        help=f"write `max {metric}` (e.g. an accuracy) or `min {metric}` (e.g. a loss)")
    return {m: i.name for m, i in said.items() if m not in bad}
