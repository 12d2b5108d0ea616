"""`mloc sweep`: a grid of `--set` values x seeds, run in parallel processes, tabulated.

    mloc sweep FILE --set 'PATH=V1,V2,...' [--set ...] [--seeds 0,1,2] [--jobs 2] [--threads 1]
               [--steps N] [--out DIR] [--logger NAME] [--resume]

Each point of the grid (every combination of the ``--set`` axes, each seed) is one
``mloc run`` in a process of its own, with ``--threads`` torch threads (default 1:
``--jobs`` runs side by side on as many cores, no oversubscription) and ``--quiet``, in its
own run folder ``OUT/NN-NAME=VALUE,...,seed=S`` (its output in ``OUT/logs/``). A run that
fails is reported with the error it reported (:func:`failure`) and the others go on; the
exit code is then 1.
The table (and ``OUT/sweep.json``) gives, per point, each evaluation's final and best value
(:class:`mloc.cli.experiments.Run`) as mean ± sample standard deviation (n - 1) over the
seeds whose run finished.

The runs die with the sweep and stop with a checkpoint on its Ctrl-C or SIGTERM
(:func:`_run_jobs`); rerunning the sweep continues it (:mod:`mloc.cli.sweep_folder`).
docs/reliability.md says what each signal does.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mloc.cli.experiments import BY_NAME, load_run, mode_label, table
from mloc.cli import sweep_folder
from mloc.cli.output import EXIT_ERRORS, EXIT_OK, Output, UsageError, io_error, make_dirs, within_limits


def split_values(text: str) -> list[str]:
    """``PATH=V1,V2`` values split at the commas outside brackets and quotes:
    ``neumann(iters=3, alpha=0.1),sama(eps=0.01)`` is two values."""
    values, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def grid(sets: list[str]) -> list[tuple[str, ...]]:
    """Every combination of the ``--set PATH=V1,V2,...`` values, as ``PATH=V`` tuples."""
    axes = []
    for s in sets:
        path, eq, values = s.partition("=")
        if not eq or not path.strip():
            raise UsageError(f"--set {s}: expected PATH=VALUE[,VALUE...]",
                             help="e.g. --set 'classifier.optimizer.lr=0.1,0.05'")
        split = split_values(values)
        if any(not v for v in split):
            raise UsageError(f"--set {s}: an empty value", help="separate the values with single commas")
        axes.append([f"{path.strip()}={v}" for v in split])
    return list(itertools.product(*axes))


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text}: expected integers separated by commas, e.g. {flag} 0,1,2") from None


def _point_name(i: int, point: tuple[str, ...], seed: int) -> str:
    parts = [f"{p.partition('=')[0].rsplit('.', 1)[-1].split('->')[-1]}={p.partition('=')[2]}" for p in point]
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", f"{i:02d}-" + ",".join(parts + [f"seed={seed}"]))[:120]


@dataclass
class Job:
    name: str
    point: tuple[str, ...]
    seed: int
    dir: Path
    argv: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    code: int | None = None
    action: str = "start"       # sweep_folder.next_step: start, resume, overwrite or skip


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
    grid(args.set or [])                   # a malformed --set: refused before the folder is looked at
    root = _root(args)
    sets = (args.set or []) if args.set or not args.resume else None     # None: the recorded ones
    asked = {"file": str(Path(args.file).resolve()), "set": sets,
             "seeds": seeds or ([None] if not args.resume else None), "steps": args.steps}
    definition = sweep_folder.admit(root, asked, args.resume)
    points, seeds = grid(definition["set"]), definition["seeds"]
    check_points(args.file, points)        # a --set that names nothing: refused before any run
    make_dirs(root)                        # a file there: `Not a directory`, naming --out
    try:
        with runfolder.held(root):
            definition = sweep_folder.admit(root, asked, args.resume)   # again, holding the lock
            return _sweep(args, out, root, definition, points, seeds)
    except runfolder.RunFolderError as e:
        raise UsageError(str(e).replace("by process", "by the sweep in process"),
                         help="wait for that sweep to finish or stop it; choose another --out") from None
    except runfolder.RunIOError as e:
        raise UsageError(str(e)) from None


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


def _sweep(args, out: Output, root: Path, definition: dict, points, seeds) -> int:
    """Run the sweep's points in ``root``, holding its lock: skip what finished, continue
    what stopped (:func:`mloc.cli.sweep_folder.next_step`), tabulate; 130 after Ctrl-C."""
    jobs = [_job(args, root, i, point, seed, definition["steps"]) for i, point in enumerate(points) for seed in seeds]
    make_dirs(root / "logs")
    record = {**definition, "status": "running", "threads": args.threads, "jobs": args.jobs,
              "runs": [j.name for j in jobs]}
    sweep_folder.write_record(root, record)
    counts = {a: sum(j.action == a for j in jobs) for a in ("skip", "resume", "overwrite")}
    again = ", ".join(f"{n} {what}" for n, what in ((counts["skip"], "finished (skipped)"),
                                                     (counts["resume"], "to resume from a checkpoint"),
                                                     (counts["overwrite"], "to start again")) if n)
    out.err(f"sweep: {len(jobs)} runs ({len(points)} points x {len(seeds)} seeds) in {root}, "
            f"{args.jobs} at a time, {args.threads} thread{'s' * (args.threads != 1)} each"
            + (f"; continuing it: {again}" if again else ""))
    t0 = time.perf_counter()
    interrupted = _run_jobs(jobs, args.jobs, root, out, args.threads)
    failed = [j for j in jobs if j.code != 0]
    table, summary = sweep_table(jobs, seeds != [None])
    status = "interrupted" if interrupted else "failed" if failed else "finished"
    sweep_folder.write_record(root, {**record, "status": status, "seconds": round(time.perf_counter() - t0, 1),
                                     "points": summary})
    if interrupted:
        stopped = [j.name for j in jobs if j.code == 130]
        out.err(f"interrupted: {len(jobs) - len(failed)} of {len(jobs)} runs finished"
                + (f"; stopped with a checkpoint: {', '.join(stopped)}" if stopped else "")
                + f"; continue with the same command, or `mloc sweep {args.file} --resume --out {root}`")
        return 130
    out.out(table)
    out.err(f"wrote {root / 'sweep.json'}; {len(jobs) - len(failed)} of {len(jobs)} runs finished in "
            f"{time.perf_counter() - t0:.1f} s" + (f"; failed: {', '.join(j.name for j in failed)}" if failed else ""))
    return EXIT_ERRORS if failed else EXIT_OK


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


SWEEP_STOP = ("stopping the sweep: each running run stops after its step with a checkpoint; "
              "Ctrl-C again to abort them without one")


def _run_jobs(jobs: list[Job], parallel: int, root: Path, out: Output, threads: int) -> bool:
    """Run the ``jobs`` not skipped, ``parallel`` at a time (each one's output in
    ``root/logs/NAME.log``); a failure is reported and the others go on. Returns whether
    the sweep was interrupted.

    The runs die with the sweep, whatever kills it (:func:`mloc.runtime.processes.workers.child_of`:
    the kernel's SIGKILL when it exits), and run in sessions of their own, so a terminal's
    Ctrl-C reaches the sweep alone. Ctrl-C or SIGTERM to the sweep sends each running run
    one SIGINT (:func:`mloc.runtime.processes.workers.interrupt`): it stops after its step with a
    checkpoint and status ``interrupted``, as an interrupted ``mloc run`` does; the sweep
    waits for them and starts no other. A second Ctrl-C kills them at once. A log that
    cannot be opened stops them all the same way."""
    from mloc.runtime.processes import workers
    waiting, running = [j for j in jobs if j.action != "skip"], []
    done = len(jobs) - len(waiting)
    for j in (j for j in jobs if j.action == "skip"):
        out.err(f"[-/{len(jobs)}] {j.name}: finished before; skipped")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with workers.sigterm_as_interrupt():
        try:
            while waiting or running:
                while waiting and len(running) < parallel:
                    _start(waiting.pop(0), root, env, running)
                time.sleep(0.1)
                for job in [j for j in running if j.proc.poll() is not None]:
                    running.remove(job)
                    done += 1
                    _report(job, done, len(jobs), root, out)
        except KeyboardInterrupt:
            workers.interrupt([j.proc for j in running], SWEEP_STOP)
            for job in running:
                job.code = job.proc.returncode
            return True
        except BaseException:              # a log that cannot be opened: stop them all
            workers.interrupt([j.proc for j in running], SWEEP_STOP)
            raise
    return False


def _start(job: Job, root: Path, env: dict, running: list[Job]) -> None:
    """Start ``job``'s run (its output appended to its log when it resumes) and add it to
    ``running`` at once, so that an interrupt a moment later stops it too."""
    from mloc.runtime.processes import workers
    log = root / "logs" / f"{job.name}.log"
    try:
        with open(log, "ab" if job.action == "resume" else "wb") as f:
            job.proc = subprocess.Popen(job.argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=workers.child_of(os.getpid()), start_new_session=True)
    except OSError as e:
        raise io_error(e, log) from None
    running.append(job)
    job.started = time.perf_counter()


def _report(job: Job, done: int, total: int, root: Path, out: Output) -> None:
    job.code = job.proc.returncode
    took = time.perf_counter() - job.started
    how = " (resumed)" if job.action == "resume" else ""
    if job.code == 0:
        out.err(f"[{done}/{total}] {job.name}: done{how} in {took:.1f} s")
    else:
        error = failure(root / "logs" / f"{job.name}.log", job.dir, job.code)
        out.err(f"[{done}/{total}] {job.name}: failed{how} (exit {job.code}) after {took:.1f} s; see "
                f"{root / 'logs' / (job.name + '.log')}" + "".join(f"\n    {line}" for line in error))


_HEADLINE = re.compile(r"^error(\[[A-Z]\d+\])?: ")


def failure(log: Path, run_dir: Path, code: int, most: int = 3) -> list[str]:
    """What a failed run reported, to show under its line: each diagnostic's headline in its
    output (``error[E702]: the program's code raised ...``, up to ``most`` of them) with its
    locations (``-->``), notes and help; else the error its ``summary.json`` records; else
    the last lines of its output. A run killed by a signal says which first."""
    lines = [f"killed by {signal.Signals(-code).name}"] if code < 0 and -code in signal.valid_signals() else []
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:                 # removed or unreadable meanwhile: the failure is still reported
        text = []
    blocks: list[list[str]] = []
    current: list[str] | None = None          # the diagnostic being read; a blank line ends it
    for line in text:
        if _HEADLINE.match(line):
            current = [line.rstrip()]
            blocks.append(current)
        elif not line.strip():
            current = None
        elif current is not None and line.strip().startswith(("-->", "= help:", "= note:")):
            current.append(line.rstrip())
    if blocks:
        shown = [line for b in blocks[:most] for line in b]
        more = len(blocks) - most
        return lines + shown + ([f"... and {more} more error{'s' * (more != 1)}"] if more > 0 else [])
    from mloc.runtime.run.selection import SUMMARY
    try:
        error = json.loads((run_dir / SUMMARY).read_text(encoding="utf-8")).get("error")
    except (OSError, ValueError, AttributeError):
        error = None
    if isinstance(error, str) and error:
        return lines + [f"error: {error}"]
    return lines + [line for line in text if line.strip()][-3:]


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {std:.4f}"


def sweep_table(jobs: list[Job], by_seed: bool) -> tuple[str, list[dict]]:
    """The table `mloc sweep` prints (a row per grid point: its runs' final and best metrics
    as mean ± sample std over the seeds that finished) and the same as data. A metric's
    best follows its direction (:meth:`mloc.cli.experiments.Run.best_of`), named in its
    column's header (``best acc (max)``, ``best test_loss (min, by name)``); a metric
    without one has no best column."""
    groups: dict[tuple[str, ...], list[Job]] = {}
    for j in jobs:
        groups.setdefault(j.point, []).append(j)
    summary, metrics, modes = [], [], {}
    for point, members in groups.items():
        ok = [load_run(j.dir) for j in members if j.code == 0]
        finals = [r.final() for r in ok]
        for name in (k for f in finals for k in f):
            if name not in metrics:
                metrics.append(name)
        bests = {m: [b for r in ok if (b := r.best_of(m)) is not None] for m in metrics}
        for m, found in bests.items():
            if found and m not in modes:
                modes[m] = (found[0]["mode"], found[0]["declared"])
        summary.append({"set": list(point), "runs": [j.name for j in members], "finished": len(ok),
                        "final": {m: [f[m] for f in finals if m in f] for m in metrics},
                        "best": {m: [b["value"] for b in found] for m, found in bests.items() if found},
                        "direction": {m: {"mode": found[0]["mode"], "declared": found[0]["declared"]}
                                      for m, found in bests.items() if found}})
    for row in summary:                               # metrics first seen in a later group
        for m in metrics:
            row["final"].setdefault(m, [])
    ranked = [m for m in metrics if m in modes]
    header = ["SET", "RUNS"] + [f"final {m}" for m in metrics] + \
             [f"best {m} ({mode_label(*modes[m])})" for m in ranked]
    rows = [tuple(header)]
    for row in summary:
        cells = [" ".join(row["set"]) or "(as written)", f"{row['finished']}/{len(row['runs'])}"]
        cells += [_mean_std(row["final"][m]) for m in metrics]
        cells += [_mean_std(row["best"].get(m, [])) for m in ranked]
        rows.append(tuple(cells))
    notes = ["mean ± std over seeds (sample std, n-1)" if by_seed else "one run per point"]
    notes += [BY_NAME] if any(not d for _, d in modes.values()) else []
    unranked = [m for m in metrics if m not in modes]
    notes += [f"no best for {', '.join(unranked)}: neither the program nor the name says whether higher or "
              "lower is better; declare it with `checkpoint best on max|min METRIC`"] if unranked else []
    return table(rows) + "".join(f"\n({n})" for n in notes), summary


def add_command(command) -> None:
    """Register sweep on the CLI's subparser factory."""
    p = command("sweep", "run a grid of overrides x seeds in parallel processes and tabulate the results",
                cmd_sweep)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("--set", action="append", metavar="PATH=V1,V2,...",
                   help="a grid axis: the values split at top-level commas (commas inside calls stay); repeatable")
    p.add_argument("--seeds", metavar="S1,S2,...", help="seeds to run each point with (default: the program's)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--steps", type=int, help="outer steps per run (default: the program's)")
    p.add_argument("--out", metavar="DIR", help="the sweep's folder (default: a fresh runs/PROGRAM/sweepN)")
    p.add_argument("--logger", action="append", metavar="NAME", help="passed to each run (csv, tensorboard, wandb)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out (default: the program's latest runs/PROGRAM/sweepN): finished "
                        "runs are skipped, stopped ones resume from their checkpoints; the --set, --seeds and "
                        "--steps not given are the sweep's. Rerunning the same command continues it too")
