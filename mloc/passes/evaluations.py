"""The compile-time trial of the train block's evaluations (part of the trace pass).

Each `eval [NAME] every N = CALL` is called once, before training, on real modules in
their initial state (built by their `module` calls), the way a run calls it
(:func:`mloc.runtime.grad.buffers.inference`: evaluation mode, no autograd, no buffer changed):

- a call that raises is E702 at the evaluation;
- a value that is not a number, a 0-dim tensor or a dict of them keyed by strings is E707
  at the evaluation (the run would fail at its first evaluation, after training);
- `checkpoint best on` / `stop when` naming a metric that none of the evaluations returned
  is E603 at the metric, with the metrics they did return.

The random generators (Python's, torch's, numpy's when imported) are restored after, so
the trial changes nothing the run sees.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostic, did_you_mean
from mloc.passes.loader import evaluate


def try_evaluations(g, mods: dict, raised) -> list[Diagnostic]:
    """Diagnostics for the program's evaluations (see the module docstring); ``raised(span,
    what, err)`` makes the E702 of a call that raises."""
    from mloc.runtime.program.evaluations import as_metrics, invalid, trial

    train, out, names, modules = g.info.train, [], set(), {}
    for e in train.evals:
        try:
            for r in e.call.read_names():
                if r not in modules:
                    modules[r] = trial(lambda r=r: evaluate(g.problem(r).module.call, mods), ())
            value = trial(lambda e=e: evaluate(e.call.call, {**mods, **modules}),
                          [modules[r] for r in e.call.read_names()])
        except Exception as err:  # noqa: BLE001 - user code
            out.append(raised(e.call.span, f"the evaluation `{e.name}`", err))
            continue
        wrong = invalid(value)
        if wrong is not None:
            out.append(Diagnostic(
                "E707", f"the evaluation `{e.name}` returns {wrong}", e.call.span,
                label="tried on the initial modules",
                help="return a number, a 0-dim tensor (e.g. `acc.mean()`), or a dict of them keyed by "
                     "name, e.g. `{\"top1\": a, \"top5\": b}`"))
            continue
        names.update(as_metrics(e.name, value, e.named))
    if out:
        return out
    return [_unknown(w, names) for w in (train.best, train.stop) if w is not None and w.metric not in names]


def _unknown(watched, names: set[str]) -> Diagnostic:
    metrics = ", ".join(f"`{n}`" for n in sorted(names))
    return Diagnostic("E603", f"no evaluation returns a metric `{watched.metric}`", watched.span,
                      label="unknown metric",
                      help=did_you_mean(watched.metric, names) or f"the evaluations return {metrics}")
