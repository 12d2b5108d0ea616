"""A sweep's runs as supervised processes: start them ``--jobs`` at a time, report each as it
ends, stop them all on Ctrl-C or SIGTERM. What runs comes from a :class:`Source` (a fixed
list for grids and random search, trials asked one by one for Optuna); nothing here knows
which. docs/reliability.md says what each signal does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mloc.cli.output import Output, io_error

SWEEP_STOP = ("stopping the sweep: each running run stops after its step with a checkpoint; "
              "Ctrl-C again to abort them without one")
POLL_S = 0.1


@dataclass
class Job:
    name: str
    point: tuple[str, ...]
    seed: int | None
    dir: Path
    argv: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    code: int | None = None
    action: str = "start"       # sweep_folder.next_step: start, resume, overwrite or skip
    pruned: int | None = None   # the step at which a search's pruner stopped it (SIGINT, exit 130)
    extra: dict = field(default_factory=dict)      # what a search keeps about it (its trial)


class Source:
    """The runs of a sweep: :meth:`next` gives the next one to start (None: none now),
    :meth:`ended` hears of each that ended, :meth:`watch` sees the running ones at every
    poll (a pruner reads their metrics there). This one serves a fixed list."""

    def __init__(self, jobs: list[Job]):
        self.jobs, self._waiting = jobs, [j for j in jobs if j.action != "skip"]

    @property
    def total(self) -> int:
        return len(self.jobs)

    def skipped(self) -> list[Job]:
        return [j for j in self.jobs if j.action == "skip"]

    def next(self) -> Job | None:
        return self._waiting.pop(0) if self._waiting else None

    def pending(self) -> bool:
        return bool(self._waiting)

    def ended(self, job: Job) -> None:
        pass

    def watch(self, running: list[Job]) -> None:
        pass

    def record(self) -> dict:
        """What ``sweep.json`` keeps about the search besides the runs (nothing for a list)."""
        return {}

    def verdict(self) -> str | None:
        """A line under the table naming the search's best point (None for a list)."""
        return None


def run_jobs(source: Source, parallel: int, root: Path, out: Output, threads: int) -> bool:
    """Run what ``source`` gives, ``parallel`` at a time (each one's output in
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
    running: list[Job] = []
    done = len(source.skipped())
    for j in source.skipped():
        out.err(f"[-/{source.total}] {j.name}: {'pruned' if j.pruned is not None else 'finished'} before; skipped")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with workers.sigterm_as_interrupt():
        try:
            while True:
                while len(running) < parallel and (job := source.next()) is not None:
                    start(job, root, env, running)
                if not running and not source.pending():
                    break
                time.sleep(POLL_S)
                source.watch(running)
                for job in [j for j in running if j.proc.poll() is not None]:
                    running.remove(job)
                    done += 1
                    report(job, done, source.total, root, out)
                    source.ended(job)
        except KeyboardInterrupt:
            workers.interrupt([j.proc for j in running], SWEEP_STOP)
            for job in running:
                job.code = job.proc.returncode
            return True
        except BaseException:              # a log that cannot be opened: stop them all
            workers.interrupt([j.proc for j in running], SWEEP_STOP)
            raise
    return False


def start(job: Job, root: Path, env: dict, running: list[Job]) -> None:
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


def prune(job: Job, step: int) -> None:
    """Stop ``job``'s run as Ctrl-C would (it checkpoints and exits 130), as pruned at ``step``."""
    if job.pruned is None and job.proc is not None and job.proc.poll() is None:
        job.pruned = step
        job.proc.send_signal(signal.SIGINT)


def report(job: Job, done: int, total: int, root: Path, out: Output) -> None:
    job.code = job.proc.returncode
    took = time.perf_counter() - job.started
    how = " (resumed)" if job.action == "resume" else ""
    if job.code == 0:
        out.err(f"[{done}/{total}] {job.name}: done{how} in {took:.1f} s")
    elif job.pruned is not None and job.code == 130:
        out.err(f"[{done}/{total}] {job.name}: pruned at step {job.pruned} after {took:.1f} s "
                "(stopped with a checkpoint)")
    else:
        error = failure(root / "logs" / f"{job.name}.log", job.dir, job.code)
        out.err(f"[{done}/{total}] {job.name}: failed{how} (exit {job.code}) after {took:.1f} s; see "
                f"{root / 'logs' / (job.name + '.log')}" + "".join(f"\n    {line}" for line in error))


def failed(job: Job) -> bool:
    """A run that ended neither finished nor pruned (a pruned run is a search's decision)."""
    return job.code != 0 and not (job.pruned is not None and job.code == 130)


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
