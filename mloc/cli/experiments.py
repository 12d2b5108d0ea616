"""The commands around runs: `plot` (curves), `runs` (what ran), `sweep` (a grid of runs).

    mloc plot RUN... [-o out.png|out.svg] [--metric NAME...]
    mloc runs [DIR]
    mloc sweep FILE --set 'PATH=V1,V2,...' [--set ...] [--seeds 0,1,2] [--jobs 2] [--threads 1]
               [--steps N] [--out DIR] [--logger NAME] [--resume]
               [--search random|optuna --trials N --search-seed S ...] (mloc.cli.sweep)

They read what a run folder holds (``metrics.jsonl``, whose schema is in
:mod:`mloc.runtime.run.metrics`; ``config.json``; ``summary.json`` when the run wrote one;
``.lock``) and nothing else. A curve is named as the loggers name it
(:func:`mloc.runtime.files.loggers.scalars`): ``PROBLEM/loss``, ``PROBLEM/lr``,
``PROBLEM/grad_norm``, ``eval/METRIC``.

**Best** follows the metric's **direction** (:meth:`Run.direction`): the one the program
declares (``checkpoint best on max|min METRIC`` or ``stop when max|min METRIC ...``, which
``config.json`` records and ``summary.json``'s ``best`` names); for a metric it declares none
for, the **name rule** (:func:`mode_by_name`): ``min`` for a name holding ``loss``, ``err``,
``mse``, ``mae``, ``nll`` or ``perplexity``, ``max`` for one holding ``acc``, ``f1``,
``auc``, ``precision`` or ``recall``, and no best at all for any other name (or one that
matches both). The tables say which: ``(max)`` declared, ``(min, by name)`` from the name.
The best value is ``summary.json``'s ``best`` for the metric it names (the value the run
itself reported, kept in ``best.pt``); otherwise the highest (``max``) or lowest (``min``)
evaluation in ``metrics.jsonl``, NaN never best, a tie kept at the earlier step. `mloc runs`
shows the declared metric's best, else the first evaluation's that has a direction.
**Status**: ``running`` while a process
holds the folder's lock (:func:`mloc.runtime.files.runfolder.lock_owner`; a killed run's, a
zombie's, is not held); else ``summary.json``'s status (``interrupted`` also for a run
aborted by a second Ctrl-C, and ``interrupted (resumable)`` when a checkpoint is there;
``pruned at step N`` for a search's trial that its sweep's ``sweep.json`` records as stopped
by the pruner, which is how such a run ends); else ``finished`` when the last
record is a ``summary`` at the configured last step, ``crashed`` otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from mloc.cli.output import EXIT_OK, Output, UsageError, io_error, make_dirs

EXAMPLES = {
    "plot": "examples:\n  mloc plot runs/data_reweighting/latest                 (in the terminal)\n"
            "  mloc plot runs/data_reweighting/1 runs/data_reweighting/2 -o curves.png\n"
            "  mloc plot runs/sweep1/* --metric eval/acc -o acc.svg",
    "runs": "examples:\n  mloc runs\n  mloc runs runs/data_reweighting",
    "sweep": "examples:\n  mloc sweep programs/data_reweighting.mlo --set 'classifier.optimizer.lr=0.1,0.05,0.01' "
             "--seeds 0,1,2 --jobs 2\n"
             "  mloc sweep programs/data_reweighting.mlo --set 'weight_net->classifier.hypergrad="
             "neumann(iters=3, alpha=0.1),sama(eps=0.01)' --steps 500\n"
             "  mloc sweep programs/hpo_grid.mlo --search random --trials 10 --set 'model.loss.log_decay=uniform(-4,7)'\n"
             "  mloc sweep programs/hpo_grid.mlo --search optuna --trials 10 --set 'model.loss.log_decay=uniform(-4,7)' "
             "--metric val_loss --direction min",
}


# --- reading run folders -----------------------------------------------------------------

@dataclass
class Run:
    """What a run folder holds (see the module docstring)."""

    dir: Path
    records: list[dict]
    config: dict = field(default_factory=dict)
    summary: dict | None = None

    @property
    def steps_done(self) -> int:
        if self.summary and isinstance(self.summary.get("steps_done"), int):
            return self.summary["steps_done"]
        return max((r["step"] for r in self.records), default=0)

    def curves(self) -> dict[str, list[tuple[float, float]]]:
        """``{name: [(step, value), ...]}`` for every scalar the loggers would log."""
        from mloc.runtime.files.loggers import scalars
        out: dict[str, list[tuple[float, float]]] = {}
        for r in self.records:
            for name, value in scalars(r).items():
                out.setdefault(name, []).append((float(r["step"]), value))
        return out

    def evals(self) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        for r in self.records:
            if r.get("kind") == "eval" and isinstance(r.get("value"), (int, float)):
                out.setdefault(r["eval"], []).append((r["step"], float(r["value"])))
        return out

    def final(self) -> dict[str, float]:
        """Each evaluation's last value (the losses' when there is none)."""
        if self.summary and isinstance(self.summary.get("final"), dict) and self.summary["final"]:
            return {k: v for k, v in self.summary["final"].items() if isinstance(v, (int, float))}
        evals = self.evals()
        if evals:
            return {k: v[-1][1] for k, v in evals.items()}
        return {k: v[-1][1] for k, v in self.curves().items() if k.endswith("/loss")}

    def direction(self, metric: str) -> tuple[str, bool] | None:
        """``(mode, declared)`` for ``metric`` (the module docstring): the direction the
        program declares (``declared`` True), else the name rule's; None for neither."""
        best = self.summary.get("best") if self.summary else None
        if isinstance(best, dict) and best.get("metric") == metric and best.get("mode") in MODES:
            return best["mode"], True
        declared = (self.config.get("program") or {}).get("directions") or {}
        if declared.get(metric) in MODES:
            return declared[metric], True
        mode = mode_by_name(metric)
        return None if mode is None else (mode, False)

    def best(self) -> dict | None:
        """``{"metric", "mode", "declared", "step", "value"}`` of the metric `mloc runs` shows
        (the declared one, else the first evaluation with a direction), or None."""
        best = self.summary.get("best") if self.summary else None
        declared = (self.config.get("program") or {}).get("directions") or {}
        candidates = ([best["metric"]] if isinstance(best, dict) and "metric" in best else []) + \
            list(declared) + list(self.evals())
        for metric in dict.fromkeys(candidates):
            found = self.best_of(metric)
            if found is not None:
                return found
        return None

    def best_of(self, metric: str) -> dict | None:
        """``{"metric", "mode", "declared", "step", "value"}``: the best evaluation of
        ``metric`` in its direction (module docstring); None without a direction or a value."""
        direction = self.direction(metric)
        if direction is None:
            return None
        mode, declared = direction
        best = self.summary.get("best") if self.summary else None
        if isinstance(best, dict) and best.get("metric") == metric and isinstance(best.get("value"), (int, float)):
            return {"metric": metric, "mode": mode, "declared": declared, "step": best.get("step"),
                    "value": best["value"]}
        points = [(s, v) for s, v in self.evals().get(metric, []) if not math.isnan(v)]
        if not points:
            return None
        sign = 1.0 if mode == "max" else -1.0
        step, value = max(points, key=lambda sv: (sign * sv[1], -sv[0]))     # a tie: the earlier step
        return {"metric": metric, "mode": mode, "declared": declared, "step": step, "value": value}

    def status(self) -> str:
        from mloc.runtime.files.runfolder import lock_owner
        if lock_owner(self.dir) is not None:
            return "running"
        if self.summary and self.summary.get("status"):
            status = str(self.summary["status"])
            if status == "failed" and self.summary.get("error") == "interrupted":
                status = "interrupted"          # written so before 2026-12-01
            if status == "interrupted" and (at := pruned_at(self.dir)) is not None:
                return f"pruned at step {at}"
            if status == "interrupted" and (self.dir / "checkpoint.pt").is_file():
                status += " (resumable)"
            return status
        steps = self.config.get("steps")
        last = self.records[-1] if self.records else None
        if last and last.get("kind") == "summary" and (steps is None or last["step"] >= steps):
            return "finished"
        return "crashed"


def pruned_at(directory: Path) -> int | None:
    """The step at which a search's pruner stopped the run in ``directory``, from the
    ``trials`` of the sweep record beside it (``../sweep.json``); None when it is no pruned
    trial (or the record cannot be read: the run's own files say the rest)."""
    import json
    try:
        record = json.loads((directory.parent / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    trials = record.get("trials") if isinstance(record, dict) else None
    for t in trials if isinstance(trials, list) else ():
        if isinstance(t, dict) and t.get("name") == directory.name and t.get("state") == "pruned":
            return t.get("pruned_at") if isinstance(t.get("pruned_at"), int) else None
    return None


MODES = ("max", "min")
_MIN_NAMES = re.compile(r"loss|err|mse|mae|nll|perplexity", re.I)
_MAX_NAMES = re.compile(r"acc|f1|auc|precision|recall", re.I)
BY_NAME = ("by name: min for a name holding loss, err, mse, mae, nll or perplexity, max for acc, f1, auc, "
           "precision or recall; `checkpoint best on max|min METRIC` declares it")


def mode_by_name(metric: str) -> str | None:
    """The name rule for a metric whose direction the program does not declare (module
    docstring): ``min``, ``max``, or None when the name says neither, or both."""
    low, high = bool(_MIN_NAMES.search(metric)), bool(_MAX_NAMES.search(metric))
    return "min" if low and not high else "max" if high and not low else None


def mode_label(mode: str, declared: bool) -> str:
    """How a table names a direction: ``max`` (declared) or ``min, by name``."""
    return mode if declared else f"{mode}, by name"


def load_run(directory: Path) -> Run:
    """Read a run folder; a :class:`UsageError` when it holds no metrics or a file that is
    not what mloc writes (:mod:`mloc.runtime.files.runread`: the message names the file)."""
    from mloc.runtime.files import runread
    from mloc.runtime.run.records import read_metrics
    from mloc.runtime.files.runfolder import RunIOError
    directory = Path(directory)
    path = directory / "metrics.jsonl"
    try:
        records = read_metrics(path)
        config = runread.config(directory / "config.json") or {}
        summary = runread.summary(directory / "summary.json")
    except FileNotFoundError:
        raise UsageError(f"{directory} holds no metrics.jsonl", help="pass a run folder (mloc runs lists them)") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except RunIOError as e:
        raise UsageError(str(e), help="docs/reliability.md says what a run folder may hold; "
                                      "move the file aside to read the rest") from None
    return Run(directory, records, latest_start(config), summary or None)


def latest_start(config: dict) -> dict:
    """What the run was last started with: the first start's record (``config.json``'s
    "run") with the latest resume's fields over it (a resume may give more ``--steps``)."""
    resumes = [r for r in config.get("resumes") or () if isinstance(r, dict)]
    return {**(config.get("run") or {}), **(resumes[-1] if resumes else {})}


def load_runs(dirs: list[Path], out: Output) -> list[Run]:
    """The runs of ``dirs`` that can be read; each one that cannot is skipped with a note
    on stderr (why, naming the file)."""
    runs = []
    for d in dirs:
        try:
            runs.append(load_run(d))
        except UsageError as e:
            out.err(f"note: skipped {d}: {e}")
    return runs


def find_runs(root: Path) -> list[Path]:
    """The run folders under ``root`` (it included), sorted; ``latest`` links skipped."""
    root = Path(root)
    found = {p.parent for p in root.rglob("metrics.jsonl") if "latest" not in p.relative_to(root).parts}
    if (root / "metrics.jsonl").is_file():
        found.add(root)
    return sorted(found, key=lambda p: [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(p))])


def labels(dirs: list[Path]) -> list[str]:
    """Legend names: each folder's name, with its parent's while two would be the same."""
    names = [d.resolve().name for d in dirs]
    if len(set(names)) < len(names):
        names = [f"{d.resolve().parent.name}/{d.resolve().name}" for d in dirs]
    return names


# --- mloc plot ----------------------------------------------------------------------------

PANELS = (("losses", "/loss"), ("learning rates", "/lr"), ("evaluations", "eval/"))


def _panels(runs: list[Run], names: list[str], metrics: list[str] | None) -> list[tuple[str, dict]]:
    """``[(title, {legend: points})]``: the losses, learning rates and evaluations (or the
    ``--metric`` curves, one panel each), every run's in the same panel."""
    curves = [r.curves() for r in runs]
    several = len(runs) > 1
    if metrics:
        wanted = [(m, m) for m in metrics]
        match = lambda key, name: name == key or name.endswith("/" + key)                     # noqa: E731
    else:
        wanted = list(PANELS)
        match = lambda key, name: key in name and not name.startswith("speed/")               # noqa: E731
    panels = []
    for title, key in wanted:
        series = {}
        for label, c in zip(names, curves):
            for name, points in c.items():
                if match(key, name):
                    series[f"{label}: {name}" if several else name] = points
        if series:
            panels.append((title, series))
    if metrics and not panels:
        known = sorted({n for c in curves for n in c})
        raise UsageError(f"no curve named {', '.join(metrics)} in {', '.join(names)}",
                         help=f"the curves are: {', '.join(known)}")
    return panels


def cmd_plot(args, out: Output) -> int:
    runs = [load_run(Path(d)) for d in args.runs] if len(args.runs) == 1 else \
        load_runs([Path(d) for d in args.runs], out)
    if not runs:
        raise UsageError(f"none of {', '.join(args.runs)} can be read (the notes above say why)")
    names = labels([r.dir for r in runs])
    panels = _panels(runs, names, args.metric)
    if not panels:
        raise UsageError(f"nothing to plot: {', '.join(args.runs)} hold{'s' * (len(runs) == 1)} no records yet")
    if args.output is None:
        from mloc.cli.textplot import plot
        out.out("\n\n".join(plot(title, series) for title, series in panels))
        return EXIT_OK
    write_figure(panels, Path(args.output))
    out.err(f"wrote {args.output}")
    return EXIT_OK


def write_figure(panels: list[tuple[str, dict]], path: Path) -> None:
    """One matplotlib figure, a panel per row (a log scale for the losses), saved as
    ``path`` (its suffix: png, svg or pdf). Evaluations, and any curve of one point (which
    a line alone would not show), get a marker at each point."""
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"cannot write {path}: the output must end in .png, .svg or .pdf")
    try:
        import matplotlib
    except ImportError:
        raise UsageError("writing a plot needs matplotlib, which is not installed",
                         help="pip install 'mloc[plot]' (or pip install matplotlib); without -o the curves "
                              "are drawn in the terminal") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), sharex=True, squeeze=False)
    runs = list(dict.fromkeys(label.split(": ")[0] for _, series in panels for label in series if ": " in label))
    styles = ("-", "--", ":", "-.")
    for ax, (title, series) in zip(axes[:, 0], panels):
        curves: list[str] = []
        for label, points in series.items():                # a color per run, a line style per curve
            run, _, curve = label.rpartition(": ")
            curves += [curve] if curve not in curves else []
            color = f"C{runs.index(run) % 10}" if run else None
            marked = title == "evaluations" or curve.startswith("eval/") or len(points) == 1
            ax.plot([x for x, _ in points], [y for _, y in points], label=label, linewidth=1.2, color=color,
                    linestyle=styles[curves.index(curve) % len(styles)] if run else "-",
                    marker="o" if marked else None, markersize=4)
        if title == "losses" and all(y > 0 for s in series.values() for _, y in s):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    try:
        make_dirs(path.parent, path)
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise io_error(e, path) from None
    finally:
        plt.close(fig)


# --- mloc runs ----------------------------------------------------------------------------

def cmd_runs(args, out: Output) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise UsageError(f"no such folder: {root}", help="runs are written under runs/ (mloc run --out DIR elsewhere)")
    rows, by_name = [("RUN", "PROGRAM", "SET", "STEPS", "BEST", "STATUS")], False
    for run in load_runs(find_runs(root), out):
        d = run.dir
        program = run.config.get("program") or {}
        best = run.best()
        by_name |= bool(best) and not best["declared"]
        rows.append((str(d), program.get("name") or Path(program.get("file") or "?").stem, " ".join(program.get("set") or ()) or "-",
                     f"{run.steps_done}/{run.config.get('steps', '?')}",
                     f"{best['metric']}={best['value']:.4g}@{best['step']} ({mode_label(best['mode'], best['declared'])})"
                     if best else "-", run.status()))
    if len(rows) == 1:
        out.err(f"no runs under {root}")
        return EXIT_OK
    out.out(table(rows))
    if by_name:                        # the rule, under the table (on stderr: the table stays parseable)
        out.err(f"({BY_NAME})")
    return EXIT_OK


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# --- registration -------------------------------------------------------------------------

def add_commands(command) -> None:
    """Register plot and runs on the CLI's subparser factory (sweep: :mod:`mloc.cli.sweep`)."""
    p = command("plot", "plot a run's losses, learning rates and evaluations against steps (several overlay)",
                cmd_plot)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (holding metrics.jsonl)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write a .png, .svg or .pdf (needs matplotlib: mloc[plot]); default: draw in the terminal")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help="plot only this curve (e.g. eval/acc, classifier/loss, loss); repeatable")

    p = command("runs", "list the runs under a folder: program, overrides, steps, best metric, status", cmd_runs)
    p.add_argument("dir", nargs="?", default="runs", metavar="DIR", help="where to look (default: runs)")

