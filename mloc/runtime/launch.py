"""Entry point of a generated `train.py`: parse its options, open the run folder, train.

    python train.py [--steps N] [--seed S] [--device D] [--precision P] [--dtype float64]
                    [--out DIR] [--resume DIR] [--overwrite] [--quiet] [--threads N]
                    [--logger csv,tensorboard,wandb]

The run folder follows the same rule as `mloc run` (:mod:`mloc.runtime.runfolder`): a new
run never writes into a folder holding another one unless `--overwrite` is given; without
`--out`, a fresh `runs/NAME/N`. Under `mloc run --nproc N` every worker runs this with
`--launched-by PID` (:mod:`mloc.runtime.workers`): the launcher has opened the folder, and
the worker only checks that it still owns it. Under a plain `torchrun`, rank 0 opens it.
Exit codes: 0 done, 1 the run failed (NaN/Inf, an error in the program's code), 2 a bad
option, folder, checkpoint or an I/O error, 3 (a worker only) another rank failed first,
101 a bug in mloc, 130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mloc.lang.limits import flag_error
from mloc.runtime.checkpoint import CheckpointError, load_checkpoint
from mloc.runtime.distributed import is_peer_failure, launched_rank
from mloc.runtime.engine import Program, RunConfig
from mloc.runtime.loggers import LoggerError
from mloc.runtime.loggers import check_available as check_loggers
from mloc.runtime.loggers import parse as parse_loggers
from mloc.runtime.finite import NonFiniteError
from mloc.runtime.loop import Intervals, Stop, Where, resume, train
from mloc.runtime.precision import PRECISIONS, DeviceError
from mloc.runtime.progress import Progress
from mloc.runtime.selection import Selection, failed_summary
from mloc.runtime.runfiles import amend_config, write_config
from mloc.runtime.runfolder import CHECKPOINT, RunFolder, RunFolderError, RunIOError, check_owner, choose
from mloc.runtime.schedules import ScheduleError
from mloc.runtime.threads import Threads
from mloc.runtime.threads import decide as decide_threads
from mloc.runtime.user_modules import put_first
from mloc.runtime.usercode import user_error
from mloc.runtime.workers import EXIT_PEER, die_with_parent

_FOLDER_ERRORS = (CheckpointError, RunFolderError, RunIOError, DeviceError, LoggerError)


def program_dir(generated_file: str, relative: str) -> Path:
    """Put the program's directory (relative to the generated file) first on sys.path; the
    modules it has are imported from it even if another program's ran before
    (:mod:`mloc.runtime.user_modules`)."""
    return put_first(Path(generated_file).resolve().parent / relative)


def build(ns: dict, config: RunConfig) -> Program:
    """Instantiate the program a generated module (`ns`, its globals) declares."""
    return Program(name=ns["NAME"], specs=ns["PROBLEMS"], edges=ns["EDGES"], semantics=ns["SEMANTICS"],
                   build_modules=ns["build_modules"], data=ns["DATA"], schedule=ns["outer_step"],
                   config=config, evaluations=ns["EVALUATIONS"], compositions=ns.get("COMPOSITION"),
                   chains=ns.get("CHAINS", ()))


@dataclass(frozen=True)
class RunOptions:
    """What `train.py`'s command line (and `mloc run`) may set; None keeps the program's
    default (its `DEFAULTS`). `dtype` None trains in the modules' own dtype; `out` None is
    a fresh `runs/NAME/N`; `launched_by` is the pid of the `--nproc` launcher."""

    steps: int | None = None
    seed: int | None = None
    device: str | None = None
    precision: str | None = None
    dtype: str | None = None
    out: Path | None = None
    resume: Path | None = None
    overwrite: bool = False
    quiet: bool = False
    launched_by: int | None = None
    threads: int | None = None          # torch's intra-op threads; None: mloc.runtime.threads decides
    logger: tuple[str, ...] | None = None   # loggers beside metrics.jsonl (mloc.runtime.loggers)

    def config(self, defaults: RunConfig) -> RunConfig:
        given = {k: v for k, v in (("steps", self.steps), ("seed", self.seed), ("device", self.device),
                                    ("precision", self.precision)) if v is not None}
        return replace(defaults, dtype=self.dtype, **given)

    def argv(self) -> list[str]:
        """The same options as `train.py` arguments (what a `--nproc` launch passes on)."""
        out = []
        for flag in ("steps", "seed", "device", "precision", "dtype", "out", "resume", "launched_by", "threads"):
            if getattr(self, flag) is not None:
                out += [f"--{flag.replace('_', '-')}", str(getattr(self, flag))]
        out += ["--logger", ",".join(self.logger)] if self.logger else []
        return out + (["--overwrite"] if self.overwrite else []) + (["--quiet"] if self.quiet else [])


def parser(defaults: RunConfig) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train this compiled mloc program.")
    p.add_argument("--steps", type=int, help=f"outer steps (default {defaults.steps})")
    p.add_argument("--seed", type=int, help=f"random seed (default {defaults.seed})")
    p.add_argument("--device", help=f"cpu, cuda, cuda:N or auto (default {defaults.device})")
    p.add_argument("--precision", choices=PRECISIONS, help=f"default {defaults.precision}")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="cast the modules, the batches and the evaluations' data arguments to this dtype")
    p.add_argument("--out", type=Path, help="folder for metrics.jsonl and checkpoint.pt (default: a fresh runs/NAME/N)")
    p.add_argument("--resume", type=Path, metavar="DIR",
                   help="continue from DIR/checkpoint.pt, in DIR unless --out names another (empty) folder")
    p.add_argument("--overwrite", action="store_true", help="start over in an --out folder that holds a run")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--threads", type=int, help="torch's CPU threads (default: from the machine's load and the "
                                                "program's size, shown in the first line)")
    p.add_argument("--logger", action="append", metavar="NAME",
                   help="also log to csv, tensorboard or wandb (a comma list or repeated)")
    p.add_argument("--launched-by", type=int, help=argparse.SUPPRESS)
    return p


def _say(err: Exception, code: str | None = None, where: str = "") -> None:
    help = getattr(err, "help", None)
    print(f"error{f'[{code}]' if code else ''}: {err}{where}" + (f"\n  = help: {help}" if help else ""),
          file=sys.stderr)


def main(ns: dict, argv: list[str] | None = None) -> int:
    """`python train.py [options]`: parse the options, open the run folder, then `run`."""
    args = parser(ns["DEFAULTS"]).parse_args(argv)
    try:
        args.logger = usable_loggers(args.logger) or None
    except LoggerError as e:
        _say(e)
        return 2
    options = RunOptions(**vars(args))
    if options.steps is not None and options.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    if options.threads is not None and options.threads < 1:
        print("error: --threads must be at least 1", file=sys.stderr)
        return 2
    bad = flag_error("--steps", options.steps) or flag_error("--seed", options.seed)
    if bad:                             # mloc.lang.limits: as `mloc run` refuses them
        print(f"error: {bad}", file=sys.stderr)
        return 2
    try:
        options, record = resumed(ns, options)
        return _main(ns, options, options.config(ns["DEFAULTS"]), record)
    except KeyboardInterrupt:
        if options.launched_by is None:
            print("interrupted", file=sys.stderr)
        return 130
    except _FOLDER_ERRORS as e:
        _say(e)
        return 2
    except Exception as e:  # noqa: BLE001 - the last line of defence, as in `mloc run`: a bug in mloc
        import traceback
        traceback.print_exc()
        print(f"error[E900]: internal error: {type(e).__name__}: {e}\n  = note: this is a bug in mloc, not in "
              "your program; please report it with the traceback above", file=sys.stderr)
        return 101


def resumed(ns: dict, options: RunOptions) -> tuple[RunOptions, dict | None]:
    """`--resume DIR` (not in a `--nproc` worker, whose launcher passes every option):
    the options left open taken from the run's last start, and that record
    (:mod:`mloc.runtime.resumption`). This `train.py` carries its `--set`s compiled in, so a
    run started with others is refused (:class:`RunFolderError`): it would silently continue
    with this file's values."""
    if options.resume is None or options.launched_by is not None:
        return options, None
    from mloc.runtime import resumption
    record = resumption.last_start(options.resume)
    sets, compiled = resumption.recorded_sets(record), tuple(ns.get("OVERRIDES", ()))
    if sets is not None and set(sets) != set(compiled):
        said = lambda texts: " ".join(f"--set {t!r}" for t in texts) or "no --set"    # noqa: E731
        raise RunFolderError(f"the run in {options.resume} was last started with {said(sets)}, and this train.py "
                             f"was compiled with {said(compiled)}; nothing was written",
                             f"resume it with its own train.py (python {Path(options.resume) / 'train.py'} --resume "
                             f"{options.resume}), or with `mloc run FILE --resume {options.resume}`, which applies "
                             "the run's --set and shows any you change")
    given = {k: getattr(options, k) for k in (*resumption.TRAIN, "dtype")}
    return replace(options, **resumption.inherit(record, given)), record


def _main(ns: dict, options: RunOptions, config: RunConfig, record: dict | None = None) -> int:
    rank = launched_rank()
    if rank is not None:
        die_with_parent()               # a worker never outlives its launcher
    if options.launched_by is not None:
        if os.getppid() != options.launched_by:
            return EXIT_PEER            # the launcher is gone already: write nothing
        check_owner(options.out, options.launched_by)
        return run(ns, config, options.out, options.resume, quiet=options.quiet, owner=options.launched_by,
                   threads=options.threads, loggers=options.logger or ())   # rank 0 alone shows progress
    if rank not in (None, 0):           # a plain torchrun: rank 0 opens the folder, the others write nothing
        return run(ns, config, options.out or Path("."), options.resume, quiet=True, threads=options.threads)
    changed = None
    if options.resume is not None:
        from mloc.runtime.resumption import changes, changes_note, options_of
        check_resume(options.resume, ns["NAME"], config.steps)
        changed = changes(record, options_of(config), options.resume)
        if changed:
            print(changes_note(options.resume, changed), file=sys.stderr)
    from mloc.runtime.build import resolve_device
    resolve_device(config.device)       # before the folder: a device that is not there leaves nothing
    choice = choose(options.out, options.resume, options.overwrite, ns["NAME"])
    with RunFolder(choice) as folder:
        if options.resume is not None:      # again, holding the lock: the checkpoint that counts
            check_resume(folder.dir, ns["NAME"], config.steps)
        program = program_record(ns, file=ns.get("__file__"))
        write_config(folder.dir, run_record(config, program, options.resume, threads=options.threads,
                                            loggers=options.logger or (), changes=changed))
        return run(ns, config, folder.dir, folder.dir if options.resume else None, options.quiet,
                   owner=folder.owner, threads=options.threads, loggers=options.logger or ())


def check_resume(directory: Path, name: str, steps: int) -> int:
    """The step of `directory`'s checkpoint, read and verified before anything is written;
    a :class:`RunFolderError` when `steps` leaves nothing to train. Made before the folder
    is opened, to refuse early, and again holding its lock (a run that went on there while
    this start waited): that one counts, as the folder rule is applied again there."""
    step = int(load_checkpoint(Path(directory) / CHECKPOINT, name)["step"])
    if steps <= step:
        raise RunFolderError(f"the checkpoint in {directory} is at step {step}, and the run is {steps} steps "
                             "long: there is nothing left to train; nothing was written",
                             f"pass --steps above {step} to train further")
    return step


def usable_loggers(values) -> tuple[str, ...]:
    """`--logger` values as names, each one's package installed (:class:`LoggerError`)."""
    names = parse_loggers(values)
    check_loggers(names)
    return names


def program_record(ns: dict, **fields) -> dict:
    """What ``config.json`` records about the program (its "program"), from train.py's
    namespace: its name, the ``--set``s it was compiled with, the direction of each metric it
    declares one for (:func:`~mloc.runtime.selection.directions`), and ``fields`` (``file``,
    ``sha256``). `mloc runs` lists a run under this name, for `mloc run` and `python train.py` alike."""
    from mloc.runtime.selection import directions
    return {"name": ns["NAME"], "set": list(ns.get("OVERRIDES", ())),
            "directions": directions(ns.get("SELECTION")), **fields}


def run_record(config: RunConfig, program: dict, resumed: Path | None, nproc: int = 1,
               threads: int | None = None, loggers: tuple[str, ...] = (), changes: list[str] | None = None) -> dict:
    """What `config.json` records about one start of a run; a resume's also has `changes`,
    what it changed from the run's last start (:mod:`mloc.runtime.resumption`). `threads`
    is None until the run has chosen them (:func:`run` adds the count and its reason)."""
    import torch

    from mloc.version import __version__
    file = program.get("file")
    if file and "sha256" not in program and Path(file).is_file():
        program = {**program, "sha256": hashlib.sha256(Path(file).read_bytes()).hexdigest()}
    return {"program": program, **asdict(config), "nproc": nproc, "threads": threads,
            "loggers": list(loggers), "resumed_from": str(Path(resumed).resolve()) if resumed else None,
            "mloc": __version__, "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **({"changes": list(changes)} if resumed and changes is not None else {})}


def _rank(program: Program) -> str:
    d = program.dist
    return f" on rank {d.rank} of {d.world}" if d.world > 1 else ""


def run(ns: dict, config: RunConfig, out: Path, resume_dir: Path | None = None, quiet: bool = False,
        owner: int | None = None, threads: int | None = None, loggers: tuple[str, ...] = ()) -> int:
    """Build the program a generated module declares, train it for `config.steps` outer
    steps (from `resume_dir`'s checkpoint if given), writing to `out` (a folder opened by
    the caller; `owner` holds its lock) and to `loggers`, on `threads` CPU threads (None:
    chosen by :mod:`mloc.runtime.threads`). Exit codes as in the module docstring."""
    if threads is not None:
        import torch
        torch.set_num_threads(threads)
    try:
        program = build(ns, config)
    except DeviceError as e:
        _say(e)
        return 2
    except ScheduleError as e:
        _say(e, "E710")
        return 1
    except Exception as err:  # noqa: BLE001 - user code raising while the program is built
        if launched_rank() is not None and is_peer_failure(err):
            return EXIT_PEER
        rank = launched_rank()
        return user_error(err, "building the program" + (f" on rank {rank}" if rank is not None else ""))
    chosen = decide_threads(program.modules.values(), threads, program.dist.world)
    if threads is None and program.dist.is_main:
        amend_config(Path(out), threads=chosen.count, threads_reason=chosen.reason)
    launched = launched_rank() is not None     # a worker: its launcher says it is stopping, and sends SIGINT
    stop = Stop(note=not launched)
    try:
        with stop.handling((signal.SIGINT,) if launched else (signal.SIGINT, signal.SIGTERM)):
            return _train(program, ns, config, Path(out), resume_dir, quiet, owner, loggers, stop, chosen)
    except KeyboardInterrupt:
        if not stop.requested or not program.dist.is_main:
            raise
        print(f"aborted by a second interrupt: nothing was saved for step {program.step_count + 1}"
              + _kept(Path(out)), file=sys.stderr)
        return 130
    finally:
        program.close()


def _kept(out: Path) -> str:
    """What is on disk to resume from, if anything: `; PATH (an earlier step) is kept ...`."""
    path = out / CHECKPOINT
    if not path.is_file():
        return "; there is no checkpoint to resume from"
    return f"; {path} (an earlier step) is kept: continue from it with `--resume {out}`"


def banner(program: Program, config: RunConfig, out: Path, chosen: Threads | None = None) -> str:
    """The line a run starts with: what it runs on (and why that many threads, unless
    `--threads` said)."""
    import torch
    threads = torch.get_num_threads()
    why = f" ({chosen.reason})" if chosen is not None and chosen.reason else ""
    return (f"training {program.name} on {program.device}, precision {config.precision}, dtype "
            f"{config.dtype or 'as built'}, {threads} thread{'s' * (threads != 1)}{why}, nproc {program.dist.world} "
            f"-> {out}")


def _train(program: Program, ns: dict, config: RunConfig, out: Path, resume_dir: Path | None,
           quiet: bool, owner: int | None, loggers: tuple[str, ...] = (), stop: Stop | None = None,
           chosen: Threads | None = None) -> int:
    where, selection = Where(), Selection.from_spec(ns.get("SELECTION"))
    try:
        with failed_summary(selection, program, out):
            if resume_dir:
                resume(program, Path(resume_dir), selection)
            start, t0 = program.step_count, time.perf_counter()
            with Progress(ns["NAME"], config.steps, enabled=not quiet and program.dist.is_main) as progress:
                progress.note(banner(program, config, out, chosen) + (f" (from step {start})" if start else ""))
                train(program, config.steps, out, Intervals(**ns["INTERVALS"]), progress, owner, where,
                      loggers=loggers, selection=selection, stop=stop)
                if stop is None or stop.at is None:
                    progress.note(f"done: {program.step_count - start} steps in {time.perf_counter() - t0:.1f} s; "
                                  f"wrote {out / 'checkpoint.pt'} and {out / 'metrics.jsonl'}")
    except _FOLDER_ERRORS as e:
        _say(e)
        return 2
    except NonFiniteError as e:
        _say_nonfinite(e, program, out, ns["INTERVALS"].get("log_every", 10))
        return 1
    except ScheduleError as e:           # a schedule that runs out, or changes what it cannot
        _say(e, "E710", f" (during {where.text}{_rank(program)}; the checkpoint on disk, if any, is the last good state)")
        return 1
    except Exception as err:  # noqa: BLE001 - the program's own code raising during training
        if program.dist.world > 1 and is_peer_failure(err):
            return EXIT_PEER
        return user_error(err, where.text + _rank(program), config.dtype, program.device)
    if stop is not None and stop.at is not None:
        if program.dist.is_main:
            more = f" --steps {config.steps}" if config.steps != ns["DEFAULTS"].steps else ""
            print(f"interrupted at step {stop.at} of {config.steps}: wrote {out / CHECKPOINT}; continue with "
                  f"`--resume {out}{more}`", file=sys.stderr)
        return 130
    return 0


def _say_nonfinite(err: NonFiniteError, program: Program, out: Path, log_every: int) -> None:
    """The NaN/Inf report: the step it appeared at, the step the check found it after (the
    run's last, what summary.json counts), and the checkpoint to go back to if there is one."""
    done, path = program.step_count, out / CHECKPOINT
    kept = f"the last good checkpoint is {path}" if path.is_file() else "no checkpoint was written before it"
    cause = f"\n  = note: {err.note}" if err.note else ""
    print(f"error: {err}{_rank(program)}{cause}\n  = note: found by the check after step {done} (the finiteness check "
          f"runs every {log_every} steps, at each log); the run stopped there, {done} steps done\n"
          f"  = help: {kept}; lower the learning rate, clip gradients or check the data", file=sys.stderr)
