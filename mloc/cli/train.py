"""The commands that run the user's code: `compile`, `plan`, `run`, `hypergrad`.

They run the whole pipeline (`mloc.codegen.compile.PIPELINE`), whose `trace` pass imports
torch and the program's modules; `check`, `graph` and `--help` never get here.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

from mloc.cli.output import (EXIT_ERRORS, EXIT_OK, Output, UsageError, add_pass_options, make_dirs,
                             print_timings, printer, report, summary)
from mloc.codegen.compile import PIPELINE, Compiled, compile_program, load_generated
from mloc.codegen.overrides import OverrideError
from mloc.ir.printer import dump_dot
from mloc.passes.plan import format_bytes, plan_table, plan_to_json
from mloc.runtime.files.options import add_flags, add_launch_flags


def _compiled(args, out: Output, out_dir: Path | None = None, gate=None, compile: str = "auto") -> Compiled | None:
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
        compiled = compile_program(args.file, tuple(args.set or ()), out_dir, observer=observe,
                                   compile=compile or "auto")
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


def compiled_files(compiled: Compiled) -> dict[str, str]:
    """What a compile writes into its folder: file name -> text."""
    return {"train.py": compiled.source,
            "plan.json": json.dumps(plan_to_json(compiled.plan), indent=2, sort_keys=True) + "\n",
            "graph.dot": dump_dot(compiled.unit.graph)}


def write_outputs(compiled: Compiled, out_dir: Path) -> Path:
    from mloc.runtime.files.runfiles import write_text
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in compiled_files(compiled).items():
        write_text(out_dir / name, text)
    return out_dir / "train.py"


def cmd_compile(args, out: Output) -> int:
    out_dir = Path(args.output)
    make_dirs(out_dir)                  # an unusable -o is exit 2 before the slow trace
    compiled = _compiled(args, out, out_dir)
    if compiled is None:
        return EXIT_ERRORS
    from mloc.runtime.files.runfolder import RunIOError
    try:
        train = write_outputs(compiled, out_dir)
    except RunIOError as e:
        raise UsageError(str(e), help="check that the folder is writable and the disk has room") from None
    out.err(f"wrote {train}, {out_dir / 'plan.json'}, {out_dir / 'graph.dot'}\n"
            f"run it with: python {train}")
    return EXIT_OK


def cmd_plan(args, out: Output) -> int:
    compiled = _compiled(args, out, compile=args.compile)
    if compiled is None:
        return EXIT_ERRORS
    if args.json:
        out.out(json.dumps(plan_to_json(compiled.plan), indent=2, sort_keys=True))
    else:
        out.out(plan_table(compiled.plan))
    return EXIT_OK


def cmd_run(args, out: Output) -> int:
    """Compile into the run folder's place, then start the run there
    (:func:`mloc.runtime.processes.launch.start`: the run folder, `config.json`, training here, in
    `--nproc` workers or as a `--pipeline`)."""
    from mloc.runtime.files import runfolder
    from mloc.runtime.files.loggers import LoggerError
    from mloc.runtime.files.options import OptionError, RunOptions
    try:
        options = RunOptions.parsed(args)
    except (OptionError, LoggerError) as e:
        raise UsageError(str(e), help=e.help) from None
    if options.resume and not (options.resume / "checkpoint.pt").is_file():
        raise _no_checkpoint(options.resume, runfolder.holds_run(options.resume))
    options, record, set_changes = _resumed(args, options) if options.resume else (options, None, [])
    options = replace(options, nproc=options.nproc or 1)
    if options.multinode:               # what a machine that waits for the others shows each one to run
        options = replace(options, rerun=("mloc", "run", args.file, *_sets(args), *options.argv()))
    if options.print_torchrun:
        return _print_torchrun(args, options, out)
    if options.device is not None:      # a device that is not there: refused before the slow trace
        _device_usable(options.device, options.nproc)
    try:
        choice = _choice(args, options)
    except (runfolder.RunFolderError, runfolder.RunIOError) as e:
        raise UsageError(str(e), help=getattr(e, "help", None)) from None
    # a fresh runs/NAME/N is created later; any N sits at the same depth, which is all the
    # compiled program's relative import path depends on
    try:
        compiled = _compiled(args, out, choice.fresh_root / "1" if choice.fresh_root else choice.dir,
                             gate=None if options.device is not None else _file_device_gate(options.nproc),
                             compile=options.compile)
    except BaseException:
        _drop_scratch(options, choice)
        raise
    if compiled is None:
        _drop_scratch(options, choice)
        return EXIT_ERRORS
    if options.steps is not None:       # W105: --steps that ends a schedule early
        from mloc.passes.runlength import short_schedules
        report(out, short_schedules(compiled.unit.graph, compiled.plan.periods, options.steps,
                                    f"--steps {options.steps}"), "full")
    try:
        return _start(args, out, compiled, choice, options, record, set_changes)
    except _run_errors() as e:
        raise UsageError(str(e), help=getattr(e, "help", None)) from None


def _choice(args, options):
    """Where the run writes: the run folder (`runfolder.choose`), or on a machine other than
    node 0 of a run on several, a scratch folder of its own (:mod:`mloc.runtime.processes.nodes`)."""
    from mloc.runtime.files import runfolder
    if options.multinode and options.node_rank:
        from mloc.runtime.processes.nodes import scratch_choice
        return scratch_choice()
    return runfolder.choose(options.out, options.resume, options.overwrite, Path(args.file).stem)


def _drop_scratch(options, choice) -> None:
    """Remove a machine's scratch folder (not node 0's) when its run does not start."""
    if options.multinode and options.node_rank:
        import shutil
        shutil.rmtree(choice.dir, ignore_errors=True)


def _print_torchrun(args, options, out: Output) -> int:
    """`--print-torchrun`: the commands that run this program on each machine under
    torchrun instead (compiled by `mloc compile` into `build/`, the ranks numbered as
    `mloc run --nnodes` numbers them); nothing is compiled or trained."""
    from mloc.runtime.processes.nodes import of_options, torchrun_commands
    lines = torchrun_commands(of_options(options), "build/train.py", options.argv())
    out.out("# on every machine (or once, on a shared file system):\n"
            + shlex.join(["mloc", "compile", args.file, "-o", "build", *_sets(args)]))
    for rank, line in enumerate(lines):
        out.out(f"# node {rank}{' (rank 0: logs and writes the checkpoints in --out)' if rank == 0 else ''}:\n{line}")
    return EXIT_OK


def _sets(args) -> list[str]:
    """The command's `--set`s, as words."""
    return [x for s in args.set or () for x in ("--set", s)]


def _resumed(args, options):
    """`--resume DIR`: the options the command leaves open taken from the run's last start
    (`mloc.runtime.files.resumption`), its `--set`s merged with the command's (into `args`), that
    record, and the lines saying what the merge changed. A `--seed` or `--dtype` other than
    the run's is refused here, before the compile."""
    from mloc.codegen.overrides import merge_recorded, train_fields
    from mloc.runtime.files import resumption
    from mloc.runtime.files.runfolder import RunFolderError, RunIOError
    try:
        record = resumption.last_start(options.resume)
    except RunIOError as e:                  # a config.json that is not what mloc writes
        raise UsageError(str(e), help="docs/reliability.md says what a run folder may hold; "
                                      "move the file aside to resume with this command's options") from None
    given = {k: getattr(options, k) for k in (*resumption.INHERITED, *resumption.FIXED)}
    try:
        resumption.changes(record, {k: given[k] for k in resumption.FIXED if given[k] is not None}, options.resume)
        in_train = train_fields(args.set or ()) & set(resumption.TRAIN)
        options = replace(options, **resumption.inherit(record, given, in_train))
        sets = resumption.recorded_sets(record)
        if sets is None:
            return options, record, []
        args.set, lines = merge_recorded(sets, args.set or ())
    except RunFolderError as e:
        raise UsageError(str(e), help=e.help) from None
    except OverrideError as e:
        raise UsageError(str(e)) from None
    return options, record, lines


def _device_usable(device: str, nproc: int) -> None:
    """A `UsageError` (exit 2) when `device` is not there for `nproc` processes."""
    from mloc.runtime.program.build import resolve_device
    from mloc.runtime.base.precision import DeviceError
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


def _run_errors() -> tuple:
    """The runtime's errors that are the user's (exit 2), imported only when one is raised."""
    from mloc.runtime.program.checkpoint import CheckpointError
    from mloc.runtime.base.precision import DeviceError
    from mloc.runtime.files.runfolder import RunFolderError, RunIOError
    return CheckpointError, DeviceError, RunFolderError, RunIOError


def _start(args, out: Output, compiled: Compiled, choice, options, record: dict | None = None,
           set_changes: list[str] = ()) -> int:
    """The compiled program's run, started as `python train.py` starts one, its compiled
    files written into the run folder once it is open."""
    from mloc.runtime.processes.launch import program_record, start
    declaration = load_generated(compiled.source, str((choice.dir / "train.py").resolve()))
    if options.nproc > 1:
        _warn_per_replica(compiled, options.nproc, out)
    about = program_record(declaration, file=str(Path(args.file).resolve()), sha256=_sha256(Path(args.file)))
    return start(declaration, options, about, record, choice=choice, changes=set_changes,
                 files=compiled_files(compiled), shown=args.file)


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _warn_per_replica(compiled: Compiled, nproc: int, out: Output) -> None:
    """Once: the parts of the program that data parallelism does not average (README)."""
    from mloc.builtins import METHODS
    parts = [f"the {e.method} edge {e.upper}->{e.lower}" for e in compiled.plan.edges if METHODS[e.method].caps.unrolls]
    parts += [f"the exact nested solve of `{m}`" for c in compiled.plan.compositions.values()
              for m, _, _ in c.nested]
    if parts:
        out.err(f"warning: with --nproc {nproc}, {', '.join(parts)} run{'s' * (len(parts) == 1)} per replica: "
                "each process unrolls or solves on its own shard, and only the resulting gradients are averaged")


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
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="the run's --compile: the compiled memory estimate is shown unless off, and under on the "
                        "memory budget is held against it")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="override a field or one argument of a call (e.g. model.optimizer.lr=0.05); repeatable")
    add_pass_options(p, PIPELINE)

    p = command("run", "compile and train a program", cmd_run)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    add_flags(p)
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="change a field for this run, checked like the file: PROBLEM.FIELD, UPPER->LOWER.FIELD, "
                        "train.FIELD or a setting, or one argument of a call (PROBLEM.optimizer.lr); repeatable")
    add_launch_flags(p)
    p.add_argument("--pipeline", action="store_true",
                   help="an interlocking chain as a real pipeline: one process per stage (gloo on 127.0.0.1)")
    p.add_argument("--pipeline-delay", type=float, default=0.0, metavar="SECONDS",
                   help="with --pipeline: sleep this long per stage forward and B_in, twice per B (emulates slower devices)")
