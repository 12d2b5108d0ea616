"""The commands that run the user's code: `compile`, `plan`, `run`, `hypergrad`.

They run the whole pipeline (`mloc.codegen.compile.PIPELINE`), whose `trace` pass imports
torch and the program's modules; `check`, `graph` and `--help` never get here.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from mloc.cli.output import (EXIT_ERRORS, EXIT_OK, Output, UsageError, add_pass_options, io_error, make_dirs,
                             print_timings, printer, report, summary, within_limits)
from mloc.codegen.compile import PIPELINE, Compiled, compile_program, load_generated
from mloc.codegen.overrides import OverrideError
from mloc.ir.printer import dump_dot
from mloc.lang.vocabulary import PRECISIONS
from mloc.passes.plan import format_bytes, plan_table, plan_to_json


def _compiled(args, out: Output, out_dir: Path | None = None, gate=None) -> Compiled | None:
    """The whole pipeline on `args.file` with its `--set`s, `--print-after` and `--time-passes`;
    None (after reporting) when the program has errors. `gate(pass, unit)` sees each pass's
    result after the printer and may stop the compile by raising (a `UsageError`)."""
    show = printer(args, out)

    def observe(p, unit):
        if show is not None:
            show(p, unit)
        if gate is not None:
            gate(p, unit)
    try:
        compiled = compile_program(args.file, tuple(args.set or ()), out_dir, observer=observe)
    except OverrideError as e:
        raise UsageError(str(e)) from None
    except FileNotFoundError:
        raise UsageError(f"no such file: {args.file}", help="check the path; programs end in .mlo") from None
    except (UnicodeDecodeError, OSError) as e:
        raise UsageError(f"cannot read {args.file}: {e}") from None
    report(out, compiled.diagnostics, "full")
    if getattr(args, "time_passes", False):
        print_timings(out, compiled.unit)
    if not compiled.ok:
        out.err(f"{args.file}: failed ({summary(compiled.diagnostics) or 'see above'})")
        return None
    return compiled


def write_outputs(compiled: Compiled, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    train = out_dir / "train.py"
    _atomic_write(train, compiled.source)
    _atomic_write(out_dir / "plan.json", json.dumps(plan_to_json(compiled.plan), indent=2, sort_keys=True) + "\n")
    _atomic_write(out_dir / "graph.dot", dump_dot(compiled.unit.graph))
    return train


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cmd_compile(args, out: Output) -> int:
    out_dir = Path(args.output)
    make_dirs(out_dir)                  # an unusable -o is exit 2 before the slow trace
    compiled = _compiled(args, out, out_dir)
    if compiled is None:
        return EXIT_ERRORS
    try:
        train = write_outputs(compiled, out_dir)
    except OSError as e:
        raise io_error(e) from None
    out.err(f"wrote {train}, {out_dir / 'plan.json'}, {out_dir / 'graph.dot'}\n"
            f"run it with: python {train}")
    return EXIT_OK


def cmd_plan(args, out: Output) -> int:
    compiled = _compiled(args, out)
    if compiled is None:
        return EXIT_ERRORS
    if args.json:
        out.out(json.dumps(plan_to_json(compiled.plan), indent=2, sort_keys=True))
    else:
        out.out(plan_table(compiled.plan))
    return EXIT_OK


def cmd_run(args, out: Output) -> int:
    """Compile, open the run folder (the rule of `mloc.runtime.runfolder`), write the
    compiled files and `config.json` there, and train in this process or, with `--nproc N`,
    in N workers launched and watched by this one."""
    if args.steps is not None and args.steps < 1:
        raise UsageError("--steps must be at least 1")
    within_limits(steps=args.steps, seed=args.seed)
    if args.nproc is not None and args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    args.logger = _loggers(args.logger)
    if getattr(args, "pipeline", False) and (args.nproc or 1) > 1:
        raise UsageError("--pipeline runs one process per stage: it does not take --nproc")
    from mloc.runtime import runfolder
    if args.resume and not (Path(args.resume) / "checkpoint.pt").is_file():
        raise _no_checkpoint(Path(args.resume), runfolder.holds_run(Path(args.resume)))
    record, set_changes = _resumed(args) if args.resume else (None, [])
    args.nproc = args.nproc or 1
    if args.device is not None:         # a device that is not there: refused before the slow trace
        _device_usable(args.device, args.nproc)
    try:
        choice = runfolder.choose(Path(args.out) if args.out else None, Path(args.resume) if args.resume else None,
                                  args.overwrite, Path(args.file).stem)
    except (runfolder.RunFolderError, runfolder.RunIOError) as e:
        raise UsageError(str(e), help=getattr(e, "help", None)) from None
    # a fresh runs/NAME/N is created later; any N sits at the same depth, which is all the
    # compiled program's relative import path depends on
    compiled = _compiled(args, out, choice.fresh_root / "1" if choice.fresh_root else choice.dir,
                         gate=None if args.device is not None else _file_device_gate(args.nproc))
    if compiled is None:
        return EXIT_ERRORS
    if args.steps is not None:          # W105: --steps that ends a schedule early
        from mloc.passes.runlength import short_schedules
        report(out, short_schedules(compiled.unit.graph, compiled.plan.periods, args.steps, f"--steps {args.steps}"),
               "full")
    try:
        return _run_in_folder(args, out, compiled, choice, record, set_changes)
    except _run_errors() as e:
        raise UsageError(str(e), help=getattr(e, "help", None)) from None


def _resumed(args) -> tuple[dict | None, list[str]]:
    """`--resume DIR`: the run's last start's record (`mloc.runtime.resumption`), with the
    options the command leaves open taken from it and its `--set`s merged with the command's
    (into `args`), and the lines saying what the merge changed. A `--seed` or `--dtype` other
    than the run's is refused here, before the compile."""
    from mloc.codegen.overrides import merge_recorded, train_fields
    from mloc.runtime import resumption
    from mloc.runtime.runfolder import RunFolderError, RunIOError
    folder = Path(args.resume)
    try:
        record = resumption.last_start(folder)
    except RunIOError as e:                  # a config.json that is not what mloc writes
        raise UsageError(str(e), help="docs/reliability.md says what a run folder may hold; "
                                      "move the file aside to resume with this command's options") from None
    given = {k: getattr(args, k) for k in (*resumption.INHERITED, *resumption.FIXED)}
    try:
        resumption.changes(record, {k: given[k] for k in resumption.FIXED if given[k] is not None}, folder)
        in_train = train_fields(args.set or ()) & set(resumption.TRAIN)
        for k, v in resumption.inherit(record, given, in_train).items():
            setattr(args, k, v)
        sets = resumption.recorded_sets(record)
        if sets is None:
            return record, []
        args.set, lines = merge_recorded(sets, args.set or ())
    except RunFolderError as e:
        raise UsageError(str(e), help=e.help) from None
    except OverrideError as e:
        raise UsageError(str(e)) from None
    return record, lines


def _device_usable(device: str, nproc: int) -> None:
    """A `UsageError` (exit 2) when `device` is not there for `nproc` processes."""
    from mloc.runtime.build import resolve_device
    from mloc.runtime.precision import DeviceError
    try:
        resolve_device(device, 0, nproc)
    except DeviceError as e:
        raise UsageError(str(e), help=e.help) from None


def _file_device_gate(nproc: int):
    """The pipeline gate that checks the train block's `device` once the checks have read
    it, before the trace runs the program's code (`mloc run` without `--device`)."""
    from mloc.passes.pipeline import CHECKS

    def gate(p, unit):
        if p.name == CHECKS[-1].name and unit.ok and unit.graph is not None:
            _device_usable(unit.graph.info.train.device, nproc)
    return gate


def _no_checkpoint(folder: Path, trained: bool) -> UsageError:
    """`--resume` of a folder without a checkpoint: what to do instead, by what it holds."""
    if not folder.is_dir():
        return UsageError(f"{folder} holds no checkpoint.pt: there is no such folder",
                          help="pass the --out folder of an earlier run (mloc runs lists them)")
    if trained:
        return UsageError(f"{folder} holds no checkpoint.pt: that run ended before writing one, so it cannot "
                          "be continued", help=f"start over there with `--out {folder} --overwrite` (its metrics "
                          "and config are deleted), or choose another --out")
    return UsageError(f"{folder} holds no checkpoint.pt: no step was trained there (a start that failed before "
                      "training)", help=f"start the run again there with `--out {folder}`")


def _loggers(values) -> tuple[str, ...]:
    """`--logger` as names, each one's package installed, else a usage error saying what to install."""
    from mloc.runtime.loggers import LoggerError, check_available, parse
    try:
        names = parse(values)
        check_available(names)
    except LoggerError as e:
        raise UsageError(str(e), help=e.help) from None
    return names


def _run_errors() -> tuple:
    """The runtime's errors that are the user's (exit 2), imported only when one is raised."""
    from mloc.runtime.checkpoint import CheckpointError
    from mloc.runtime.precision import DeviceError
    from mloc.runtime.runfolder import RunFolderError, RunIOError
    return CheckpointError, DeviceError, RunFolderError, RunIOError


def _run_in_folder(args, out: Output, compiled: Compiled, choice, record: dict | None = None,
                   set_changes: list[str] = ()) -> int:
    from mloc.runtime import resumption
    from mloc.runtime.launch import RunOptions, check_resume, program_record, run, run_record
    from mloc.runtime.runfiles import write_config
    from mloc.runtime.runfolder import RunFolder, RunIOError
    ns = load_generated(compiled.source, str((choice.dir / "train.py").resolve()))
    options = RunOptions(steps=args.steps, seed=args.seed, device=args.device, precision=args.precision,
                         dtype=args.dtype, resume=Path(args.resume) if args.resume else None, quiet=args.quiet,
                         threads=args.threads, logger=args.logger)
    config = options.config(ns["DEFAULTS"])
    from mloc.runtime.build import resolve_device
    resolve_device(config.device, 0, args.nproc)    # a device for every process, before any folder or worker
    program = program_record(ns, file=str(Path(args.file).resolve()), sha256=_sha256(Path(args.file)))
    changed = None
    if options.resume is not None:
        check_resume(options.resume, ns["NAME"], config.steps)
        changed = list(set_changes) + resumption.changes(record, {**resumption.options_of(config),
                                                                  "nproc": args.nproc}, options.resume)
        before = (record or {}).get("program") or {}
        if before.get("file") == program["file"] and before.get("sha256") not in (None, program["sha256"]):
            changed.append(f"{args.file} has changed since the run's last start (its sha256 differs)")
        if changed:
            out.err(resumption.changes_note(options.resume, changed))
    with RunFolder(choice) as folder:
        if options.resume is not None:      # again, holding the lock: the checkpoint that counts
            check_resume(folder.dir, ns["NAME"], config.steps)
        try:
            train = write_outputs(compiled, folder.dir)
        except OSError as e:
            raise RunIOError(e.filename or folder.dir, e) from None
        write_config(folder.dir, run_record(config, program, options.resume, args.nproc, args.threads, args.logger,
                                            changes=changed))
        options = replace(options, out=folder.dir, resume=folder.dir if options.resume else None)
        if getattr(args, "pipeline", False):
            from mloc.runtime import pipeline
            return pipeline.run(train, ns, config, folder.dir, args.pipeline_delay, args.quiet, options.resume)
        if args.nproc > 1:
            _warn_per_replica(compiled, args.nproc, out)
            return _launch(train, args.nproc, options, out, args.quiet)      # rank 0 shows its progress
        ns["__file__"] = str(train.resolve())
        return run(ns, config, folder.dir, options.resume, quiet=options.quiet, owner=folder.owner,
                   threads=args.threads, loggers=args.logger)


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _warn_per_replica(compiled: Compiled, nproc: int, out: Output) -> None:
    """Once: the parts of the program that data parallelism does not average (README)."""
    parts = [f"the itd edge {e.upper}->{e.lower}" for e in compiled.plan.edges if e.method == "itd"]
    parts += [f"the exact nested solve of `{m}`" for c in compiled.plan.compositions.values()
              for m, _, _ in c.nested]
    if parts:
        out.err(f"warning: with --nproc {nproc}, {', '.join(parts)} run{'s' * (len(parts) == 1)} per replica: "
                "each process unrolls or solves on its own shard, and only the resulting gradients are averaged")


def _launch(train: Path, nproc: int, options, out: Output, quiet: bool) -> int:
    from mloc.runtime.workers import exit_code, launch
    if not quiet:
        out.err(f"training {train.parent} with {nproc} processes")
    outcome = launch(train, nproc, options.argv())
    if outcome.report:                  # rank 0's banner, progress and summary were shown live
        out.err(outcome.report)
    return exit_code(outcome.code)


def planned_labels(args, out: Output) -> dict | None:
    args.set = getattr(args, "set", None)
    compiled = _compiled(args, out)
    if compiled is None:
        return None
    return {(e.upper, e.lower): f"{e.render()} ×{e.unroll}, {format_bytes(e.memory)}" for e in compiled.plan.edges}


def add_commands(command) -> None:
    """Register the commands on the CLI's subparser factory."""
    p = command("compile", "compile a program to a runnable train.py (with plan.json and graph.dot)", cmd_compile)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("-o", "--output", default="build", metavar="DIR", help="output folder (default: build)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="override a field or one argument of a call (e.g. model.optimizer.lr=0.05); repeatable")
    add_pass_options(p, PIPELINE)

    p = command("plan", "show how mloc will train a program: methods, modes, memory, schedule", cmd_plan)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="override a field or one argument of a call (e.g. model.optimizer.lr=0.05); repeatable")
    add_pass_options(p, PIPELINE)

    p = command("run", "compile and train a program", cmd_run)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("--steps", type=int, help="outer (top-level) steps; default: the train block's")
    p.add_argument("--seed", type=int, help="random seed; default: the train block's")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto; default: the train block's")
    p.add_argument("--precision", choices=PRECISIONS, help="autocast precision; default: the train block's")
    p.add_argument("--dtype", choices=("float32", "float64"),
                   help="cast the modules, every floating batch and the evaluations' data arguments to this "
                        "dtype (float64 for exact comparisons); default: as the program builds them")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="change a field for this run, checked like the file: PROBLEM.FIELD, UPPER->LOWER.FIELD, "
                        "train.FIELD or a setting, or one argument of a call (PROBLEM.optimizer.lr); repeatable")
    p.add_argument("--nproc", type=int, help="data-parallel processes (gloo or nccl), started and watched by mloc; rank 0 shows its progress (default 1)")
    p.add_argument("--pipeline", action="store_true",
                   help="an interlocking chain as a real pipeline: one process per stage (gloo on 127.0.0.1)")
    p.add_argument("--pipeline-delay", type=float, default=0.0, metavar="SECONDS",
                   help="with --pipeline: sleep this long per stage forward and B_in, twice per B (emulates slower devices)")
    p.add_argument("--out", metavar="DIR",
                   help="where train.py, config.json, metrics.jsonl and checkpoint.pt go; it must not hold "
                        "another run (default: a fresh runs/PROGRAM/N, linked from runs/PROGRAM/latest)")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR (from DIR/checkpoint.pt), in DIR itself unless --out names "
                        "another folder, which must hold no run and receives a copy; the run's --set, --steps, "
                        "--device, --precision and --nproc apply unless given (a change is shown), and its "
                        "--seed and --dtype cannot change")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an --out folder that already holds a run (its checkpoint, metrics and "
                        "config are deleted)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch's CPU threads for this run (per process under --nproc); default: 1 for a small "
                        "program or on a busy machine, else the idle cores (the first line says which and why); "
                        "`mloc sweep` runs each point with 1")
    p.add_argument("--logger", action="append", metavar="NAME",
                   help="also log to csv (metrics.csv), tensorboard (tb/, needs mloc[tensorboard]) or wandb "
                        "(needs mloc[wandb]; WANDB_MODE=offline works without a network); a comma list or repeated")

