"""`mloc sweep`: a grid of `--set` values x seeds, or a random or Optuna search over
ranges, run in parallel processes, tabulated.

    mloc sweep FILE --set 'PATH=V1,V2,...' [--set ...] [--seeds 0,1,2] [--jobs 2] [--threads 1]
               [--steps N] [--out DIR] [--logger NAME] [--resume]
    mloc sweep FILE --search random|optuna --trials N --set 'PATH=loguniform(1e-3,1e-1)' [--search-seed S]
               [--metric NAME --direction min|max] [--prune-after K] [the options above]

Each point of the grid (every combination of the ``--set`` axes, each seed), or each trial
of a search (:mod:`mloc.cli.search`: ranges, random draws; :mod:`mloc.cli.search_optuna`:
TPE with median pruning), is one ``mloc run`` in a process of its own, with ``--threads``
torch threads (default 1: ``--jobs`` runs side by side on as many cores, no
oversubscription) and ``--quiet``, in its own run folder ``OUT/NN-NAME=VALUE,...,seed=S``
(its output in ``OUT/logs/``). A run that fails is reported with the error it reported
(:func:`mloc.cli.sweep_jobs.failure`) and the others go on; the exit code is then 1.
The table (and ``OUT/sweep.json``) gives, per point, each evaluation's final and best value
(:class:`mloc.cli.experiments.Run`) as mean ± sample standard deviation (n - 1) over the
seeds whose run finished (:mod:`mloc.cli.sweep_table`).

The runs die with the sweep and stop with a checkpoint on its Ctrl-C or SIGTERM
(:func:`mloc.cli.sweep_jobs.run_jobs`); rerunning the sweep continues it
(:mod:`mloc.cli.sweep_folder`). docs/reliability.md says what each signal does.
"""

from __future__ import annotations

import itertools
import re
import sys
import time
from pathlib import Path

from mloc.cli import search, sweep_folder
from mloc.cli.output import EXIT_ERRORS, EXIT_OK, Output, UsageError, make_dirs, within_limits
from mloc.cli.search import split_values  # noqa: F401  (its home before: tests import it from here)
from mloc.cli.sweep_jobs import Job, Source, failed, run_jobs
from mloc.cli.sweep_table import sweep_table
from mloc.shared.compile import MODES


def grid(sets: list[str]) -> list[tuple[str, ...]]:
    """Every combination of the ``--set PATH=V1,V2,...`` values, as ``PATH=V`` tuples;
    a range (:mod:`mloc.cli.search`) is refused: it needs ``--search``."""
    found = search.axes(sets)
    for a, s in zip(found, sets):
        if a.is_range:
            raise UsageError(f"--set {s}: a range is drawn by a search, not walked by a grid",
                             help="add --search random --trials N (or --search optuna), or list the values: "
                                  "--set PATH=V1,V2")
    return list(itertools.product(*[[f"{a.path}={v}" for v in a.values] for a in found]))


def _points(definition: dict) -> list[tuple[str, ...]] | None:
    """The sweep's points: the grid's, the random draws', or None (Optuna asks as it goes)."""
    how = definition.get("search")
    if how is None:
        return grid(definition["set"])
    if how["kind"] == "random":
        return search.random_points(search.axes(definition["set"]), how["trials"], how["seed"])
    return None


def _search(args) -> dict | None:
    """The ``--search`` part of the sweep's definition (None: a grid; under ``--resume``
    without ``--search``, the record's)."""
    if args.search is None:
        for flag in ("trials", "metric", "direction", "prune_after", "search_seed"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --search random or --search optuna")
        return None
    if args.trials is None or args.trials < 1:
        raise UsageError(f"--search {args.search} needs --trials N (N >= 1): how many runs to draw")
    if args.search == "random" and (args.metric or args.direction or args.prune_after is not None):
        raise UsageError("--metric, --direction and --prune-after steer --search optuna; random draws need none")
    if args.search_seed is not None and not 0 <= args.search_seed < 2**31:
        raise UsageError(f"--search-seed {args.search_seed}: expected an integer from 0 to 2147483647")
    if args.prune_after is not None and args.prune_after < 0:
        raise UsageError(f"--prune-after {args.prune_after}: expected a count of trials, 0 or more")
    if args.direction and args.direction not in ("min", "max"):
        raise UsageError(f"--direction {args.direction}: expected min or max")
    how = {"kind": args.search, "trials": args.trials, "seed": args.search_seed or 0}
    if args.search == "optuna":
        from mloc.cli.search_optuna import require_optuna
        require_optuna()
        how.update(metric=args.metric, direction=args.direction,
                   prune_after=5 if args.prune_after is None else args.prune_after)
    return how


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text}: expected integers separated by commas, e.g. {flag} 0,1,2") from None


def _point_name(i: int, point: tuple[str, ...], seed: int) -> str:
    parts = [f"{p.partition('=')[0].rsplit('.', 1)[-1].split('->')[-1]}={p.partition('=')[2]}" for p in point]
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", f"{i:02d}-" + ",".join(parts + [f"seed={seed}"]))[:120]


def cmd_sweep(args, out: Output) -> int:
    from mloc.runtime.files import runfolder     # not at the top: `mloc check` never imports torch
    if not Path(args.file).is_file():
        raise UsageError(f"no such file: {args.file}", help="check the path; programs end in .mlo")
    if args.jobs < 1 or args.threads < 1:
        raise UsageError("--jobs and --threads must be at least 1")
    if args.steps is not None and args.steps < 1:
        raise UsageError("--steps must be at least 1")
    from mloc.runtime.files.loggers import LoggerError
    from mloc.runtime.files.options import usable_loggers
    try:
        usable_loggers(args.logger)        # an unknown or uninstalled logger: refused before any run
    except LoggerError as e:
        raise UsageError(str(e), help=e.help) from None
    seeds = _int_list(args.seeds, "--seeds") if args.seeds else None
    within_limits(steps=args.steps, seeds=seeds or [])
    how = _search(args)
    (grid if how is None else search.axes)(args.set or [])   # a malformed --set: refused before the folder
    root = _root(args)
    sets = (args.set or []) if args.set or not args.resume else None     # None: the recorded ones
    asked = {"file": str(Path(args.file).resolve()), "set": sets,
             "seeds": seeds or ([None] if not args.resume else None), "steps": args.steps,
             "search": how if how is not None or not args.resume else None}
    definition = sweep_folder.admit(root, asked, args.resume)
    points, seeds = _points(definition), definition["seeds"]
    if definition.get("search", {}) and definition["search"]["kind"] == "optuna" and len(seeds) > 1:
        raise UsageError("--search optuna runs each trial once: give it one seed (--seeds S)",
                         help="run the best trial's values over several seeds with a grid sweep afterwards")
    check_points(args.file, points if points is not None else [_first(definition["set"])])
    make_dirs(root)                        # a file there: `Not a directory`, naming --out
    try:
        with runfolder.held(root):
            definition = sweep_folder.admit(root, asked, args.resume)   # again, holding the lock
            return _sweep(args, out, root, definition, seeds)
    except runfolder.RunFolderError as e:
        raise UsageError(str(e).replace("by process", "by the sweep in process"),
                         help="wait for that sweep to finish or stop it; choose another --out") from None
    except runfolder.RunIOError as e:
        raise UsageError(str(e)) from None


def _first(sets: list[str]) -> tuple[str, ...]:
    """One point of a search's space (each range's low end, each choice's first value): to
    check that every ``--set`` names something before any trial runs."""
    return tuple(f"{a.path}={a.values[0] if a.values else search.fmt(a.low) if a.kind != 'int' else int(a.low)}"
                 for a in search.axes(sets))


def _root(args) -> Path:
    """The sweep's folder: ``--out``; else, under ``--resume``, the latest sweep of the
    program's; else a fresh ``runs/PROGRAM/sweepN``."""
    if args.out:
        return Path(args.out)
    base = Path("runs") / Path(args.file).stem
    if args.resume:
        found = sweep_folder.latest(base)
        if found is None:
            raise UsageError(f"no sweep of {args.file} under {base} to resume", help="name it with --out")
        return found
    return _next_sweep(base)


def _sweep(args, out: Output, root: Path, definition: dict, seeds) -> int:
    """Run the sweep in ``root``, holding its lock: skip what finished, continue what
    stopped (:func:`mloc.cli.sweep_folder.next_step`), tabulate; 130 after Ctrl-C."""
    make_dirs(root / "logs")
    record = {**definition, "status": "running", "threads": args.threads, "jobs": args.jobs}
    source, what = _source(args, out, root, definition, seeds, record)
    record["runs"] = [j.name for j in source.jobs]
    sweep_folder.write_record(root, record)
    jobs = source.jobs
    counts = {a: sum(j.action == a and j.pruned is None for j in jobs) for a in ("skip", "resume", "overwrite")}
    pruned = sum(j.action == "skip" and j.pruned is not None for j in jobs)
    again = ", ".join(f"{n} {what}" for n, what in ((counts["skip"], "finished (skipped)"), (pruned, "pruned (skipped)"),
                                                     (counts["resume"], "to resume from a checkpoint"),
                                                     (counts["overwrite"], "to start again")) if n)
    out.err(f"sweep: {what} in {root}, {args.jobs} at a time, {args.threads} thread{'s' * (args.threads != 1)} each"
            + (f"; continuing it: {again}" if again else ""))
    t0 = time.perf_counter()
    interrupted = run_jobs(source, args.jobs, root, out, args.threads)
    jobs = sorted(source.jobs, key=lambda j: j.name)
    bad = [j for j in jobs if failed(j)]
    table, summary = sweep_table(jobs, len(seeds) > 1)
    status = "interrupted" if interrupted else "failed" if bad else "finished"
    record = {**record, "runs": [j.name for j in jobs], "status": status,
              "seconds": round(time.perf_counter() - t0, 1), "points": summary}
    record.update(source.record())
    sweep_folder.write_record(root, record)
    if interrupted:
        stopped = [j.name for j in jobs if j.code == 130 and j.pruned is None]
        out.err(f"interrupted: {sum(j.code == 0 for j in jobs)} of {len(jobs)} runs finished"
                + (f"; stopped with a checkpoint: {', '.join(stopped)}" if stopped else "")
                + f"; continue with the same command, or `mloc sweep {args.file} --resume --out {root}`")
        return 130
    out.out(table)
    if source.verdict():
        out.err(source.verdict())
    pruned = sum(j.pruned is not None and j.code == 130 for j in jobs)
    out.err(f"wrote {root / 'sweep.json'}; {sum(j.code == 0 for j in jobs)} of {len(jobs)} runs finished"
            + (f", {pruned} pruned" if pruned else "") + f" in {time.perf_counter() - t0:.1f} s"
            + (f"; failed: {', '.join(j.name for j in bad)}" if bad else ""))
    return EXIT_ERRORS if bad else EXIT_OK


def _source(args, out: Output, root: Path, definition: dict, seeds, record: dict) -> tuple[Source, str]:
    """What the sweep runs, and how the first line says it."""
    how, steps = definition.get("search"), definition["steps"]
    if how is None or how["kind"] == "random":
        points = _points(definition)
        jobs = [_job(args, root, i, point, seed, steps) for i, point in enumerate(points) for seed in seeds]
        kind = f"{len(points)} points" if how is None else f"{len(points)} random trials (--search-seed {how['seed']})"
        return Source(jobs), f"{len(jobs)} runs ({kind} x {len(seeds)} seeds)"
    from mloc.cli.search_objective import objective_of
    from mloc.cli.search_optuna import OptunaSource
    objective = objective_of(args.file, _first(definition["set"]), how.get("metric"), how.get("direction"))
    earlier = (sweep_folder.read_record(root) or {}).get("trials") or []

    def saved(trials: list[dict]) -> None:
        sweep_folder.write_record(root, {**record, "objective": vars(objective), "trials": trials,
                                         "runs": [t["name"] for t in trials]})
    source = OptunaSource(search.axes(definition["set"]), objective, how["trials"], how["seed"], how["prune_after"],
                          earlier, lambda i, point: _job(args, root, i, point, seeds[0], steps), saved, out)
    record["objective"] = vars(objective)
    told = f"; {len(source.trials)} told again from before" if source.trials else ""
    return source, (f"{how['trials']} Optuna trials (TPE, median pruning after {how['prune_after']} trials, "
                    f"--search-seed {how['seed']}) on {objective.mode} {objective.metric} ({objective.why}){told}")


def _job(args, root: Path, i: int, point: tuple[str, ...], seed: int | None, steps: int | None) -> Job:
    """The point's run, as the next step its folder needs (:func:`sweep_folder.next_step`)."""
    name = _point_name(i, point, seed) if seed is not None else _point_name(i, point, 0).rsplit(",seed=", 1)[0]
    action = sweep_folder.next_step(root / name)
    argv = [sys.executable, "-m", "mloc", "run", str(args.file), "--quiet", "--threads", str(args.threads)]
    if action == "resume":      # its --set, seed and steps are the run's own (config.json)
        argv += ["--resume", str(root / name)]
    else:
        argv += ["--out", str(root / name), *[a for p in point for a in ("--set", p)]]
        argv += ["--seed", str(seed)] if seed is not None else []
        argv += ["--overwrite"] if action == "overwrite" else []
    argv += ["--steps", str(steps)] if steps else []
    argv += [a for lg in args.logger or () for a in ("--logger", lg)]
    argv += ["--compile", args.compile] if args.compile != "auto" else []
    return Job(name, point, seed, root / name, argv, action=action, code=0 if action == "skip" else None)


def check_points(file: str, points: list[tuple[str, ...]]) -> None:
    """Every grid point's ``--set``s splice into the program (as ``mloc run`` would
    splice them), else the usage error ``mloc run --set`` gives; nothing is checked or run."""
    from mloc.codegen.compile import with_overrides
    from mloc.codegen.overrides import OverrideError
    for point in points:
        try:
            with_overrides(file, point)
        except OverrideError as e:
            raise UsageError(str(e)) from None
        except (UnicodeDecodeError, OSError) as e:
            raise UsageError(f"cannot read {file}: {getattr(e, 'strerror', None) or e}") from None


def _next_sweep(base: Path) -> Path:
    n = 1
    while (base / f"sweep{n}").exists():
        n += 1
    return base / f"sweep{n}"


def add_command(command) -> None:
    """Register sweep on the CLI's subparser factory."""
    p = command("sweep", "run a grid of overrides x seeds, or a random or Optuna search over ranges, in parallel "
                         "processes and tabulate the results", cmd_sweep)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("--set", action="append", metavar="PATH=V1,V2,...",
                   help="a grid axis: the values split at top-level commas (commas inside calls stay); or, with "
                        "--search, a range: uniform(a,b), loguniform(a,b), int(a,b) (both ends included), "
                        "choice(v1,v2,...); repeatable")
    p.add_argument("--seeds", metavar="S1,S2,...", help="seeds to run each point with (default: the program's)")
    p.add_argument("--search", choices=("random", "optuna"),
                   help="draw --trials points from the --set ranges instead of walking a grid: random (seeded by "
                        "--search-seed, the same draws every time) or optuna (TPE, median pruning; mloc[optuna])")
    p.add_argument("--trials", type=int, metavar="N", help="how many points a --search draws")
    p.add_argument("--search-seed", type=int, metavar="S", help="the seed of the search's draws (default 0)")
    p.add_argument("--metric", metavar="NAME",
                   help="what --search optuna optimizes (default: the program's `checkpoint best`/`stop when` "
                        "metric, else its first evaluation whose name says a direction)")
    p.add_argument("--direction", metavar="min|max", help="the --metric's direction (default: the program's)")
    p.add_argument("--prune-after", type=int, metavar="K",
                   help="--search optuna stops a trial whose best evaluation so far is worse than the median of the "
                        "other trials' at the same step, once K trials have ended (default 5; K >= --trials: no pruning)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--steps", type=int, help="outer steps per run (default: the program's)")
    p.add_argument("--out", metavar="DIR", help="the sweep's folder (default: a fresh runs/PROGRAM/sweepN)")
    p.add_argument("--logger", action="append", metavar="NAME", help="passed to each run (csv, tensorboard, wandb)")
    p.add_argument("--compile", choices=MODES, default="auto",
                   help="passed to each run (default auto: each run decides by its own step times, so two runs "
                        "may decide apart on a busy machine; on or off where runs must be comparable bit for bit)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out (default: the program's latest runs/PROGRAM/sweepN): finished "
                        "runs are skipped, stopped ones resume from their checkpoints, an Optuna study is told its "
                        "finished trials again; the --set, --seeds, --steps and --search not given are the "
                        "sweep's. Rerunning the same command continues it too")
