"""The one run path: :func:`start` opens the run folder and trains, from a typed
:class:`~mloc.runtime.files.options.RunOptions`, whichever door the run came in by.

    python train.py [--steps N] [--seed S] [--device D] [--precision P] [--dtype float64]
                    [--out DIR] [--resume DIR] [--overwrite] [--quiet] [--threads N]
                    [--logger csv,tensorboard,wandb]

`python train.py` calls :func:`main` with the program its file declares
(:class:`~mloc.runtime.run.declaration.Declaration`); `mloc run` compiles, then calls :func:`start` with the same options (and its `--nproc` or
`--pipeline`). :func:`start` resolves the device (for every process), checks a resume,
opens the run folder by :mod:`mloc.runtime.files.runfolder`'s rule (never into a folder
holding another run unless `--overwrite`; without `--out`, a fresh `runs/NAME/N`), writes
`config.json`, and trains: here, in `--nproc` workers, or as a `--pipeline`. A `--nproc`
worker runs train.py with `--launched-by PID` (:mod:`mloc.runtime.processes.workers`): the
launcher has opened the folder, the worker checks that it still owns it; under a plain
`torchrun`, rank 0 opens it. Exit codes: 0 done, 1 the run failed (NaN/Inf, an error in the
program's code), 2 a bad option, folder, checkpoint or I/O error, 3 (a worker) another rank
failed first, 101 a bug in mloc, 130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from mloc.runtime.files import resumption
from mloc.runtime.program.build import usable
from mloc.runtime.program.checkpoint import CheckpointError, load_checkpoint
from mloc.runtime.run.declaration import Declaration
from mloc.runtime.base.distributed import LaunchError, is_peer_failure, launched_rank, local_processes
from mloc.runtime.processes.ending import end_rank
from mloc.runtime.program.engine import Program, RunConfig, param_bytes
from mloc.runtime.grad.finite import NonFiniteError
from mloc.runtime.files.loggers import LoggerError
from mloc.runtime.run.loop import Stop, Where, resume, train
from mloc.runtime.files.options import OptionError, RunOptions, add_flags
from mloc.runtime.base.precision import DeviceError
from mloc.runtime.processes.progress import Progress, told
from mloc.runtime.files.runfiles import amend_config, write_config, write_text
from mloc.runtime.files.runfolder import CHECKPOINT, Choice, RunFolder, RunFolderError, RunIOError, check_owner, choose
from mloc.runtime.program.schedules import ScheduleError
from mloc.runtime.run.selection import Selection, failed_summary
from mloc.runtime.processes.threads import Threads, decide as decide_threads
from mloc.runtime.base.user_modules import put_first
from mloc.runtime.base.usercode import user_error
from mloc.runtime.processes.workers import EXIT_PEER, become_worker, finished

_FOLDER_ERRORS = (CheckpointError, RunFolderError, RunIOError, DeviceError, LoggerError, OptionError)


def program_dir(generated_file: str, relative: str) -> Path:
    """Put the program's directory (relative to the generated file) first on sys.path; the
    modules it has are imported from it even if another program's ran before
    (:mod:`mloc.runtime.base.user_modules`)."""
    return put_first(Path(generated_file).resolve().parent / relative)


def build(program: Declaration, config: RunConfig) -> Program:
    """Instantiate the program a generated module declares."""
    return Program(name=program.name, specs=program.problems, edges=program.edges, semantics=program.semantics,
                   build_modules=program.build_modules, data=program.data, schedule=program.schedule,
                   config=config, evaluations=program.evaluations, compositions=program.compositions,
                   chains=program.chains)


def _say(err: Exception, code: str | None = None, where: str = "") -> None:
    help = getattr(err, "help", None)
    print(f"error{f'[{code}]' if code else ''}: {err}{where}" + (f"\n  = help: {help}" if help else ""),
          file=sys.stderr)


def main(declaration: Declaration, file: str | None = None, argv: list[str] | None = None) -> int:
    """`python train.py [options]`: the program `file` declares, trained as the options say. A
    rank of a job (``--nproc``, torchrun) ends here, without finalization (:mod:`.ending`)."""
    code = _entry(declaration, file, argv)
    return end_rank(code) if launched_rank() is not None else code


def _entry(declaration: Declaration, file: str | None, argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(description="Train this compiled mloc program.")
    add_flags(p, declaration.defaults)
    p.add_argument("--launched-by", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        options = RunOptions.parsed(args)
    except (OptionError, LoggerError) as e:
        _say(e)
        return 2
    try:
        options, record = resumed(declaration, options)
        return _main(declaration, options, record, file)
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


def resumed(declaration: Declaration, options: RunOptions) -> tuple[RunOptions, dict | None]:
    """`--resume DIR` (not in a `--nproc` worker, whose launcher passes every option):
    the options left open taken from the run's last start, and that record
    (:mod:`mloc.runtime.files.resumption`). This `train.py` carries its `--set`s compiled in, so a
    run started with others is refused (:class:`RunFolderError`): it would silently continue
    with this file's values."""
    if options.resume is None or options.launched_by is not None:
        return options, None
    record = resumption.last_start(options.resume)
    sets, compiled = resumption.recorded_sets(record), declaration.overrides
    if sets is not None and set(sets) != set(compiled):
        said = lambda texts: " ".join(f"--set {t!r}" for t in texts) or "no --set"    # noqa: E731
        raise RunFolderError(f"the run in {options.resume} was last started with {said(sets)}, and this train.py "
                             f"was compiled with {said(compiled)}; nothing was written",
                             f"resume it with its own train.py (python {Path(options.resume) / 'train.py'} --resume "
                             f"{options.resume}), or with `mloc run FILE --resume {options.resume}`, which applies "
                             "the run's --set and shows any you change")
    given = {k: getattr(options, k) for k in (*resumption.TRAIN, "dtype")}
    return replace(options, **resumption.inherit(record, given)), record


def _main(declaration: Declaration, options: RunOptions, record: dict | None, file: str | None) -> int:
    """A worker's start (its launcher opened the folder), or :func:`start`."""
    rank = launched_rank()
    if rank is not None:
        become_worker()                 # it never outlives its launcher; a fatal signal shows its stack
    config = options.config(declaration.defaults)
    if options.launched_by is not None:
        if os.getppid() != options.launched_by:
            return EXIT_PEER            # the launcher is gone already: write nothing
        check_owner(options.out, options.launched_by)
        return finished(run(declaration, config, options.out, options.resume, quiet=options.quiet,     # rank 0 alone
                            owner=options.launched_by, threads=options.threads, loggers=options.logger or ()))  # shows progress
    if rank not in (None, 0):           # a plain torchrun: rank 0 opens the folder, the others write nothing
        return run(declaration, config, options.out or Path("."), options.resume, quiet=True, threads=options.threads)
    return start(declaration, options, program_record(declaration, file=file), record)


def start(declaration: Declaration, options: RunOptions, about: dict, record: dict | None = None, *,
          choice: Choice | None = None, changes: Sequence[str] = (), files: Mapping[str, str] = MappingProxyType({}),
          shown: str | None = None) -> int:
    """Start a run, whichever door it came in by: resolve the device (one for every
    process), check a resume (its checkpoint; what changed since `record`, the run's last
    start, after the caller's `changes`), open the run folder (`choice`, else chosen from
    the options), write the compiled `files` there (name -> text), then `config.json` (`about`:
    the program, :func:`program_record`), then train here, in `--nproc` workers or as a
    `--pipeline`. `shown`: how to name the program file in a note (default: its path)."""
    config, nproc = options.config(declaration.defaults), options.nproc or 1
    usable(config, nproc, declaration.problems)     # before the folder: a start that cannot run leaves nothing
    if options.multinode and options.node_rank:     # another machine than node 0: nothing in the run folder
        from mloc.runtime.processes.nodes import start_node
        return start_node(options, choice, files,
                          lambda: options.resume and check_resume(options.resume, declaration.name, config.steps))
    changed = None
    if options.resume is not None:
        check_resume(options.resume, declaration.name, config.steps)
        effective = {**resumption.options_of(config), **({"nproc": nproc} if options.nproc is not None else {})}
        changed = [*changes, *resumption.changes(record, effective, options.resume)]
        before = (record or {}).get("program") or {}
        edited = before.get("sha256") not in (None, about.get("sha256"))
        if "sha256" in about and before.get("file") == about["file"] and edited:
            changed.append(f"{shown or about['file']} has changed since the run's last start (its sha256 differs)")
        if changed:
            print(resumption.changes_note(options.resume, changed), file=sys.stderr)
    choice = choice or choose(options.out, options.resume, options.overwrite, declaration.name)
    with RunFolder(choice) as folder:
        if options.resume is not None:      # again, holding the lock: the checkpoint that counts
            check_resume(folder.dir, declaration.name, config.steps)
        for name, text in files.items():
            write_text(folder.dir / name, text)
        write_config(folder.dir, run_record(config, about, options.resume, nproc, options.threads,
                                            options.logger or (), changes=changed, nnodes=options.nnodes or 1))
        options = replace(options, out=folder.dir, resume=folder.dir if options.resume else None)
        return _launch(declaration, options, config, folder.owner)


def _launch(declaration: Declaration, options: RunOptions, config: RunConfig, owner: int) -> int:
    """Train in the open run folder `options.out`: here, in `--nproc` workers or as a `--pipeline`."""
    if options.pipeline:
        from mloc.runtime.processes import pipeline
        return pipeline.run(options.out / "train.py", declaration, config, options.out, options.pipeline_delay,
                            options.quiet, options.resume)
    if options.multinode or (options.nproc or 1) > 1:
        return _workers(options)
    return run(declaration, config, options.out, options.resume, quiet=options.quiet, owner=owner,
               threads=options.threads, loggers=options.logger or ())


def _workers(options: RunOptions) -> int:
    """Train in this machine's `--nproc` workers; on several machines, node 0's
    (:mod:`mloc.runtime.processes.nodes`). The run's exit code, after its one report."""
    from mloc.runtime.processes import nodes, workers
    place = nodes.of_options(options) if options.multinode else None
    if not options.quiet:
        said = (f"on {place.nnodes} machines: node 0 here ({place.held()}), meeting at {place.endpoint}"
                if place else f"with {options.nproc} processes")
        print(f"training {options.out} {said}", file=sys.stderr)
    outcome = (nodes.launch(options.out / "train.py", place, options.argv(), out=options.out) if place is not None
               else workers.launch(options.out / "train.py", options.nproc, options.argv()))
    if outcome.report:              # rank 0's banner, progress and summary were shown live
        print(outcome.report, file=sys.stderr)
    return workers.exit_code(outcome.code)


def check_resume(directory: Path, name: str, steps: int) -> int:
    """The step of `directory`'s checkpoint, read and verified before anything is written;
    a :class:`RunFolderError` when `steps` leaves nothing to train. Made before the folder is
    opened, to refuse early, and again holding its lock (a run may have gone on there): that one counts."""
    step = int(load_checkpoint(Path(directory) / CHECKPOINT, name)["step"])
    if steps <= step:
        raise RunFolderError(f"the checkpoint in {directory} is at step {step}, and the run is {steps} steps "
                             "long: there is nothing left to train; nothing was written",
                             f"pass --steps above {step} to train further")
    return step


def program_record(declaration: Declaration, **fields) -> dict:
    """What ``config.json`` records about the program (its "program"): its name, the
    ``--set``s it was compiled with, the direction of each metric it declares one for
    (:meth:`~mloc.runtime.run.declaration.Declaration.directions`), and ``fields`` (``file``,
    ``sha256``). `mloc runs` lists a run under this name, for `mloc run` and `python train.py` alike."""
    return {"name": declaration.name, "set": list(declaration.overrides), "directions": declaration.directions(),
            **fields}


def run_record(config: RunConfig, program: dict, resumed: Path | None, nproc: int = 1,
               threads: int | None = None, loggers: tuple[str, ...] = (), changes: list[str] | None = None,
               nnodes: int = 1) -> dict:
    """What `config.json` records about one start of a run; a resume's also has `changes`,
    what it changed from the run's last start (:mod:`mloc.runtime.files.resumption`). `threads`
    is None until the run has chosen them (:func:`run` adds the count and its reason).
    `nproc` is per machine; a run on several (`nnodes`) records their number too."""
    import torch

    from mloc.shared.version import __version__
    file = program.get("file")
    if file and "sha256" not in program and Path(file).is_file():
        program = {**program, "sha256": hashlib.sha256(Path(file).read_bytes()).hexdigest()}
    return {"program": program, **asdict(config), "nproc": nproc, "threads": threads,
            "loggers": list(loggers), "resumed_from": str(Path(resumed).resolve()) if resumed else None,
            "mloc": __version__, "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **({"changes": list(changes)} if resumed and changes is not None else {}),
            **({"nnodes": nnodes} if nnodes > 1 else {})}


def _rank(program: Program) -> str:
    d = program.dist
    return f" on rank {d.rank} of {d.world}" if d.world > 1 else ""


def run(declaration: Declaration, config: RunConfig, out: Path, resume_dir: Path | None = None, quiet: bool = False,
        owner: int | None = None, threads: int | None = None, loggers: tuple[str, ...] = ()) -> int:
    """Build the program `declaration` declares, train it for `config.steps` outer
    steps (from `resume_dir`'s checkpoint if given), writing to `out` (a folder opened by
    the caller; `owner` holds its lock) and to `loggers`, on `threads` CPU threads (None:
    chosen by :mod:`mloc.runtime.processes.threads`). Exit codes as in the module docstring."""
    if threads is not None:
        import torch
        torch.set_num_threads(threads)
    try:
        program = build(declaration, config)
    except (DeviceError, LaunchError, OptionError) as e:
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
    refused = _alike(program, _identity(declaration, config, resume_dir))
    if refused is not None:
        return refused
    chosen = decide_threads(program.modules.values(), threads, local_processes(program.dist.world))
    if program.dist.is_main:    # known once built: the threads chosen, rank 0's parameter bytes (its shards under fsdp)
        amend_config(Path(out), param_bytes=param_bytes(program), **({} if threads is not None else {
            "threads": chosen.count, "threads_reason": chosen.reason}))
    launched = launched_rank() is not None     # a worker: its launcher says it is stopping, and sends SIGINT
    stop = Stop(note=not launched)
    try:
        with stop.handling((signal.SIGINT,) if launched else (signal.SIGINT, signal.SIGTERM)), told(program.dist, out):
            return _train(program, declaration, config, Path(out), resume_dir, quiet, owner, loggers, stop, chosen)
    except KeyboardInterrupt:
        if not stop.requested or not program.dist.is_main:
            raise
        print(f"aborted by a second interrupt: nothing was saved for step {program.step_count + 1}"
              + _kept(Path(out)), file=sys.stderr)
        return 130
    finally:
        program.close()


def _alike(program: Program, identity: dict) -> int | None:
    """None when every rank trains what this one does (`identity`); else the exit code,
    the program closed: 2 after saying how they differ, 3 when another rank is gone."""
    try:
        program.dist.check_same(identity)
        return None
    except LaunchError as e:
        _say(e)
        code = 2
    except Exception as err:
        if not is_peer_failure(err):
            raise
        code = EXIT_PEER
    program.close()
    return code


def _identity(declaration: Declaration, config: RunConfig, resume_dir: Path | None) -> dict:
    """What every rank of a run must train alike (checked across ranks once built)."""
    return {"program": declaration.name, "--set": list(declaration.overrides), "--steps": config.steps,
            "--seed": config.seed, "--precision": config.precision, "--dtype": config.dtype,
            "--compile": config.compile, "--resume": resume_dir is not None, "--strategy": config.strategy,
            "--checkpoint-form": config.checkpoint_form}


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
    strategy = f" (strategy {program.strategy[0]}: {program.strategy[1]})" if program.dist.world > 1 else ""
    return (f"training {program.name} on {program.device}, precision {config.precision}, dtype "
            f"{config.dtype or 'as built'}, {threads} thread{'s' * (threads != 1)}{why}, nproc {program.dist.world}{strategy}, "
            f"compile {config.compile} -> {out}")


def _train(program: Program, declaration: Declaration, config: RunConfig, out: Path, resume_dir: Path | None,
           quiet: bool, owner: int | None, loggers: tuple[str, ...] = (), stop: Stop | None = None,
           chosen: Threads | None = None) -> int:
    where, selection = Where(), Selection.watching(declaration.best, declaration.stop)
    try:
        with failed_summary(selection, program, out):
            if resume_dir:
                resume(program, Path(resume_dir), selection, where)
            start, t0 = program.step_count, time.perf_counter()
            with Progress(declaration.name, config.steps, enabled=not quiet and program.dist.is_main) as progress:
                progress.note(banner(program, config, out, chosen) + (f" (from step {start})" if start else ""))
                train(program, config.steps, out, declaration.intervals, progress, owner, where,
                      loggers=loggers, selection=selection, stop=stop)
                if stop is None or stop.at is None:
                    progress.note(f"done: {program.step_count - start} steps in {time.perf_counter() - t0:.1f} s; "
                                  f"wrote {out / 'checkpoint.pt'} and {out / 'metrics.jsonl'}")
    except _FOLDER_ERRORS as e:
        _say(e)
        return 2
    except NonFiniteError as e:
        _say_nonfinite(e, program, out, declaration.intervals.log_every)
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
            more = f" --steps {config.steps}" if config.steps != declaration.defaults.steps else ""
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
