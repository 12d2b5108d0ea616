"""`mloc sweep --search optuna`: trials asked of an Optuna study as the sweep's runs, told
back when they end, pruned while they run. Optuna is an optional extra (``pip install
'mloc[optuna]'``); without it the command is a usage error naming it.

**The study.** A TPE sampler seeded with ``--search-seed`` and a median pruner, over the
ranges of :mod:`mloc.cli.search` (``uniform`` and ``loguniform``: float distributions,
``int``: an integer one, ``choice`` and grid axes: categorical). Each trial is one run
(``--jobs`` at a time, supervised as every sweep's runs are: :mod:`mloc.cli.sweep_jobs`);
``--trials`` counts them all, those of an earlier sweep in the same folder included. What
the study maximizes or minimizes is :mod:`mloc.cli.search_objective`'s.

**Pruning.** While a trial runs, the evaluations of the objective's metric that its run
appends to ``metrics.jsonl`` are read as they come (every poll of the supervisor) and
reported to its trial, step by step; when the pruner says so (the trial's best so far is
worse than the median of the other trials' at the same step, once ``--prune-after`` trials
have ended) the run gets one SIGINT, as Ctrl-C would: it stops after its step with a
checkpoint and exits 130, and the trial is told ``pruned``.

**Resume.** Each trial's number, name, ``--set``s, parameters, state and value are kept in
``sweep.json`` (``trials``), rewritten as each one ends; a rerun tells a fresh study the
finished and pruned ones again, continues any stopped with a checkpoint under its own
parameters (asked again first), and asks for the rest. Its sampler is seeded with
``--search-seed`` plus the number of trials recorded: a fresh sampler seeded as the first
one was would draw the first one's random start-up points again.
"""

from __future__ import annotations

import math
from typing import Callable

from mloc.cli.output import Output, UsageError
from mloc.cli.search import Axis, fmt
from mloc.cli.search_objective import Objective, evaluations, value_of
from mloc.cli.sweep_jobs import Job, Source, prune


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise UsageError("--search optuna needs optuna, which is not installed",
                         help="pip install 'mloc[optuna]' (or pip install optuna); --search random needs nothing") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _distribution(optuna, axis: Axis):
    d = optuna.distributions
    if axis.kind in ("grid", "choice"):
        return d.CategoricalDistribution(list(axis.values))
    if axis.kind == "int":
        return d.IntDistribution(int(axis.low), int(axis.high))
    return d.FloatDistribution(axis.low, axis.high, log=axis.kind == "loguniform")


def _text(axis: Axis, value) -> str:
    return fmt(value) if axis.kind in ("uniform", "loguniform") else str(value)


class OptunaSource(Source):
    """The trials of a study as a sweep's :class:`~mloc.cli.sweep_jobs.Source`.
    ``make_job(number, point)`` builds a trial's run; ``saved(trials)`` records them."""

    def __init__(self, axes: list[Axis], objective: Objective, trials: int, seed: int, prune_after: int,
                 earlier: list[dict], make_job: Callable[[int, tuple[str, ...]], Job],
                 saved: Callable[[list[dict]], None], out: Output):
        optuna = require_optuna()
        self.optuna, self.axes, self.objective, self.out = optuna, axes, objective, out
        self.dists = {a.path: _distribution(optuna, a) for a in axes}
        self.study = optuna.create_study(
            direction="minimize" if objective.mode == "min" else "maximize",
            sampler=optuna.samplers.TPESampler(seed=seed + len(earlier)),     # a rerun: not the same draws again
            pruner=optuna.pruners.MedianPruner(n_startup_trials=prune_after, n_warmup_steps=0))
        self.trials, self.limit, self.make_job, self.saved = [], trials, make_job, saved
        self.jobs: list[Job] = []
        self._again: list[dict] = []           # earlier trials to run on, under their own numbers
        self._number = max((t["number"] for t in earlier), default=-1) + 1
        self._retell(earlier)

    def _retell(self, earlier: list[dict]) -> None:
        """The trials of an earlier sweep: finished and pruned ones told again, stopped ones
        enqueued to run on (their folder continues from its checkpoint)."""
        from mloc.cli.sweep_folder import next_step
        T = self.optuna.trial
        for t in earlier:
            params = {k: v for k, v in (t.get("params") or {}).items() if k in self.dists}
            state, job = t.get("state"), self.make_job(t["number"], tuple(t["set"]))
            steps = {int(s): v for s, v in (t.get("reports") or {}).items()}
            if state == "complete" and next_step(job.dir) == "skip" and t.get("value") is not None:
                self.study.add_trial(T.create_trial(params=params, distributions=self.dists, value=t["value"],
                                                    intermediate_values=steps))
                job.code = 0
            elif state == "pruned":
                self.study.add_trial(T.create_trial(params=params, distributions=self.dists,
                                                    state=T.TrialState.PRUNED, intermediate_values=steps))
                job.code, job.pruned = 130, t.get("pruned_at")
            elif state == "failed":
                self.study.add_trial(T.create_trial(params=params, distributions=self.dists, state=T.TrialState.FAIL))
                job.code = 1
            else:
                self.study.enqueue_trial(params)
                self._again.append(t)
                continue
            job.action = "skip"
            self.jobs.append(job)
            self.trials.append(dict(t))

    @property
    def total(self) -> int:
        return self.limit

    def skipped(self) -> list[Job]:
        return [j for j in self.jobs if j.action == "skip"]

    def pending(self) -> bool:
        return len(self.trials) < self.limit

    def next(self) -> Job | None:
        if len(self.trials) >= self.limit:
            return None
        trial = self.study.ask(self.dists)          # an earlier trial's parameters first (enqueued)
        if self._again:
            again = self._again.pop(0)
            number, point = again["number"], tuple(again["set"])
        else:
            number, self._number = self._number, self._number + 1
            point = tuple(f"{a.path}={_text(a, trial.params[a.path])}" for a in self.axes)
        job = self.make_job(number, point)
        record = {"number": number, "name": job.name, "set": list(point), "params": dict(trial.params),
                  "state": "running", "value": None, "reports": {}}
        job.extra.update(trial=trial, record=record, offset=0, last=-1)
        self.trials.append(record)
        self.jobs.append(job)
        self.saved(self.trials)
        return job

    def watch(self, running: list[Job]) -> None:
        """Report each running trial's new evaluations; prune it when the pruner says so."""
        for job in running:
            found, job.extra["offset"] = evaluations(job.dir / "metrics.jsonl", self.objective.metric,
                                                     job.extra["offset"])
            trial = job.extra["trial"]
            for step, value in found:
                if step <= job.extra["last"] or math.isnan(value):
                    continue
                job.extra["last"] = step
                trial.report(value, step)
                job.extra["record"]["reports"][str(step)] = value
                if job.pruned is None and trial.should_prune():
                    prune(job, step)

    def ended(self, job: Job) -> None:
        self.watch([job])                      # the evaluations written since the last poll
        trial, record = job.extra["trial"], job.extra["record"]
        T = self.optuna.trial.TrialState
        if job.code == 130 and job.pruned is not None:
            self.study.tell(trial, state=T.PRUNED)
            record.update(state="pruned", pruned_at=job.pruned)
        elif job.code == 0 and (value := value_of(job.dir, self.objective)) is not None:
            self.study.tell(trial, value)
            record.update(state="complete", value=value)
        elif job.code == 130:                  # the sweep was interrupted: resumed by a rerun
            record.update(state="interrupted")
        else:
            self.study.tell(trial, state=T.FAIL)
            record.update(state="failed")
            if job.code == 0:
                self.out.err(f"note: {job.name} finished without an evaluation of {self.objective.metric}: "
                             "told to the study as failed")
        self.saved(self.trials)

    def best(self) -> dict | None:
        """The best complete trial's record, or None."""
        done = [t for t in self.trials if t.get("state") == "complete" and t.get("value") is not None]
        if not done:
            return None
        sign = 1 if self.objective.mode == "min" else -1
        return min(done, key=lambda t: (sign * t["value"], t["number"]))

    def record(self) -> dict:
        return {"objective": vars(self.objective), "trials": self.trials, "best": self.best()}

    def verdict(self) -> str | None:
        best, o = self.best(), self.objective
        return None if best is None else \
            f"best trial: {best['name']}: {o.metric} = {best['value']:.6g} ({o.mode}, {o.why}); {' '.join(best['set'])}"

