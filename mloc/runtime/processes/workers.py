"""`--nproc N`: start N worker processes of a compiled `train.py`, watch them, report once.

:func:`supervise` is the supervision itself, for any list of worker commands: `--nproc`
(:func:`launch`) and `mloc run --pipeline` (:mod:`mloc.runtime.processes.pipeline`, one worker per
stage) both run under it, so everything below holds for both.

mloc launches the workers itself rather than through ``torchrun``: each worker gets the
environment torchrun would give it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and the launcher's pid
(``--launched-by``), and

- dies with the launcher, whatever kills it (``PR_SET_PDEATHSIG``, set between fork and
  exec); a worker whose launcher is already gone when it starts exits at once, and a
  worker checks before every checkpoint that the run folder's lock still names its
  launcher (:func:`mloc.runtime.files.runfolder.check_owner`);
- writes its stderr to a file of its own (in ``TMPDIR/mloc-workers-PID-START-*``, named by
  the launcher, removed when it ends, and by the next start when it was killed:
  :mod:`mloc.runtime.files.scratch`), never to a pipe nobody reads, so a worker that writes a lot
  never blocks; rank 0's is also shown as it comes (its banner,
  progress and closing summary, live), and the other ranks' warnings about their own
  state (:mod:`mloc.shared.warning`) when the run ends. When one fails the launcher stops the others and
  shows the diagnostic of the rank that failed first, which names its rank, and nothing
  else: no launcher traceback, no second report from the ranks whose collectives broke
  because of it (they exit with :data:`EXIT_PEER`), and rank 0's own diagnostic once. A
  rank killed by a signal is reported with the last lines it wrote (for SIGABRT or
  SIGSEGV, its threads' Python stacks: :func:`become_worker`). A worker says when its run
  has finished (:func:`finished`); a crash after that, in the teardown of the interpreter
  and of the libraries (a collective library's destructor), is reported as a warning with
  the same quote, and the run, complete, succeeds (a second line: ranks end without the
  interpreter's finalization, where such crashes come from, :mod:`mloc.runtime.processes.ending`).

The workers run in a session of their own, so a terminal's Ctrl-C reaches the launcher
alone. Ctrl-C (or SIGTERM) to the launcher sends each worker one SIGINT: the ranks agree
at the next log step to stop there, rank 0 writes a checkpoint and says how to continue
(:class:`mloc.runtime.run.loop.Stop`), and the launcher waits for them; a second Ctrl-C
kills them at once, with no checkpoint for the interrupted step.

The exit code is the failing rank's (1 the run failed, 2 a usage, I/O or checkpoint error,
101 a bug in mloc), 130 after Ctrl-C, 0 when all succeed.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mloc.runtime.files import scratch
from mloc.shared.warning import RANKED

EXIT_PEER = 3           # a worker whose collective failed because another rank died first
GRACE_S = 3.0           # how long the first failure waits for a rank that failed first-hand
POLL_S = 0.02
LOG_PREFIX = "mloc-workers"  # the workers' stderr files: TMPDIR/mloc-workers-PID-START-RANDOM (mloc.runtime.files.scratch)


@dataclass(frozen=True)
class Outcome:
    """The run's exit code and the one report to show (stderr text, possibly empty)."""

    code: int
    report: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> dict:
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits, however the
    parent dies (Linux ``PR_SET_PDEATHSIG``; a no-op elsewhere). Safe between fork and
    exec: the C library was opened before the fork."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(1, int(sig), 0, 0, 0)        # PR_SET_PDEATHSIG = 1


FINISHED_VAR = "MLOC_WORKER_FINISHED"     # set by the launcher: the file a worker creates once its run has finished


def finished(code: int) -> int:
    """``code``, after saying so to the launcher when it is 0: this worker's run is done and
    everything it writes is written (:data:`FINISHED_VAR`). A crash after this point, in the
    interpreter's and the libraries' teardown, cannot change the run's results, and the
    launcher reports it as a warning (:func:`supervise`)."""
    path = os.environ.get(FINISHED_VAR)
    if code == 0 and path:
        with contextlib.suppress(OSError):
            Path(path).touch()
    return code


def become_worker() -> None:
    """What a rank does first: it dies with its launcher (:func:`die_with_parent`), and a
    fatal signal in it (a C++ abort in a collective library, a segfault) writes every
    thread's Python stack to its stderr (:mod:`faulthandler`), which the launcher's report
    of its death quotes."""
    die_with_parent()
    faulthandler.enable(all_threads=True)


def _preexec() -> None:
    die_with_parent(signal.SIGKILL)


def child_of(parent: int):
    """A ``preexec_fn`` for a child that must not outlive ``parent`` (this process): it
    asks for SIGKILL when its parent exits (:func:`die_with_parent`), then exits at once if
    the parent is already gone (it died between the fork and the request; the kernel does
    not send the signal for a death that came first). `mloc sweep`'s runs start so."""
    def preexec() -> None:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def launch(train_py: Path, nproc: int, argv: list[str]) -> Outcome:
    """Run ``python train_py *argv --launched-by PID`` in ``nproc`` processes (see the
    module docstring); returns when all have exited."""
    port = free_port()
    command = [sys.executable, str(train_py), *argv, "--launched-by", str(os.getpid())]
    return supervise([command] * nproc, [_env(rank, nproc, port) for rank in range(nproc)],
                     [f"rank {rank} of {nproc}" for rank in range(nproc)])


NPROC_STOP = "stopping at the next log step to write a checkpoint; Ctrl-C again to abort without one"


def supervise(commands: list[list[str]], envs: list[dict], names: list[str],
              timeout: float | None = None, stopping=NPROC_STOP, tick=None) -> Outcome:
    """Start one worker per command (``commands[r]`` with ``envs[r]``; ``names[r]`` says
    which worker in a report: ``rank 1 of 2``) as the module docstring says, watch them
    and return the run's outcome when all have exited: the ``--nproc`` launcher's, and
    ``mloc run --pipeline``'s (:mod:`mloc.runtime.processes.pipeline`). ``timeout`` (seconds, None:
    none) stops every worker and fails the run: a guard for tests, not a run option.
    ``stopping``: what the first Ctrl-C says (where the workers will stop), or a function
    that says it then. ``tick()``,
    if given, is called at every poll while they run (what a machine of a multi-node run
    says while its workers wait to join: :mod:`mloc.runtime.processes.joining`); when it
    returns an exit code instead of None, the workers are stopped and the run ends with
    that code and no report (the caller's to give)."""
    nproc = len(commands)
    with scratch.folder(LOG_PREFIX) as logs, sigterm_as_interrupt():
        paths = [Path(logs) / f"rank{r}.err" for r in range(nproc)]
        procs, shown = [], None
        try:
            for rank in range(nproc):
                with open(paths[rank], "wb") as err:
                    procs.append(subprocess.Popen(
                        commands[rank], env={**envs[rank], FINISHED_VAR: str(_finished(paths[rank]))},
                        stderr=subprocess.PIPE if rank == 0 else err,
                        preexec_fn=_preexec, start_new_session=True))
                if rank == 0:
                    shown = threading.Thread(target=_tee, args=(procs[0].stderr, paths[0]), daemon=True)
                    shown.start()
            code, rank = _watch(procs, timeout, tick, [_finished(p) for p in paths])
        except KeyboardInterrupt:
            code, rank = interrupt(procs, stopping)
        finally:
            _stop(procs, signal.SIGTERM, timeout=5.0)
            if shown is not None:
                shown.join(timeout=5.0)
        if code == 130 and rank == -1:
            return Outcome(130, "aborted by a second interrupt: the workers were killed; nothing was saved for "
                                "the interrupted step")
        if code == 130:         # rank 0 said where it stopped, shown live
            told = procs[0].returncode == 130 and paths[0].read_bytes().strip()
            return Outcome(130, "" if told else "interrupted")
        if rank == -2:
            return Outcome(1, f"error: the workers did not finish within {timeout:g} s; they were stopped")
        if rank == -3:          # tick() ended the run: its caller says why
            return Outcome(code, "")
        own = procs[0].returncode
        if code > 0 and code != 130 and own not in (None, 0, EXIT_PEER) and own > 0:
            code, rank = own, 0     # rank 0 failed first-hand too: its diagnostic, shown already, is the one
        report = _report(code, rank, names, paths)
        crashes = _crashed_after_finishing(procs, names, paths)
        return Outcome(code, "\n".join(s for s in (_ranks_warnings(paths, rank if code else 0), crashes, report) if s))


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM to the launcher is a Ctrl-C (a graceful stop), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _poll(p: subprocess.Popen) -> int | None:
    """``p.poll()``, also when the Ctrl-C that got us here interrupted an earlier ``poll()``
    between its taking and its releasing ``Popen``'s wait lock: that ``poll()`` then returns
    None for ever, and an exited worker stayed a zombie while the launcher waited (seen once
    in CI). Then the child is reaped here with ``os.waitpid``."""
    if p.poll() is not None:
        return p.returncode
    try:
        pid, status = os.waitpid(p.pid, os.WNOHANG)
    except ChildProcessError:           # reaped by poll() after all
        return p.returncode
    if pid == 0:
        return None
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode


def interrupt(procs: list[subprocess.Popen], stopping=NPROC_STOP) -> tuple[int, int]:
    """The first Ctrl-C: one SIGINT to each worker (they stop at the next log step with a
    checkpoint; one still joining its group ends at once, by SIGINT's default action), then
    wait for all; a second Ctrl-C kills them. Returns (code, rank) as :func:`_watch` does:
    130, or the first other failure while stopping; (130, -1) when aborted."""
    sys.stderr.write(f"\n{stopping() if callable(stopping) else stopping}\n")
    sys.stderr.flush()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    try:
        while any(_poll(p) is None for p in procs):
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        while any(_poll(p) is None for p in procs):     # not p.wait(): its lock may be lost
            time.sleep(POLL_S)
        return 130, -1
    codes = [130 if p.returncode == -signal.SIGINT else p.returncode for p in procs]
    failed = [(c, r) for r, c in enumerate(codes) if c not in (0, 130, EXIT_PEER)]
    return failed[0] if failed else ((130, 0) if 130 in codes else (0, 0))


def _tee(pipe, path: Path) -> None:
    """Rank 0's stderr, as it comes: to the launcher's stderr and to ``path``."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(path, "wb") as f:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            f.write(chunk)
            sys.stderr.write(decode.decode(chunk))
            sys.stderr.flush()


def _finished(path: Path) -> Path:
    """The file a worker whose stderr is ``path`` creates when its run has finished (:func:`finished`)."""
    return path.with_suffix(".finished")


def _settled(code: int | None, marker: Path) -> int | None:
    """A worker's exit code as the run counts it: 0 for a crash by a fatal signal after
    it said it had finished (``marker``), else ``code``."""
    return 0 if code is not None and -code in _FATAL and marker.exists() else code


def _crashed_after_finishing(procs: list[subprocess.Popen], names: list[str], paths: list[Path]) -> str:
    """A warning for each worker that crashed in its teardown, after its run had finished."""
    said = []
    for p, name, path in zip(procs, names, paths):
        if p.returncode is not None and p.returncode < 0 and _settled(p.returncode, _finished(path)) == 0:
            signame = signal.Signals(-p.returncode).name
            words = "".join(f"\n  | {line}" for line in _last_words(path.read_text(encoding="utf-8", errors="replace")))
            said.append(f"warning: {name} crashed while exiting (killed by {signame}) after its run had finished: "
                        f"the run is complete and its files are written" + (f"; the last it said:{words}" if words else ""))
    return "\n".join(said)


def _watch(procs: list[subprocess.Popen], timeout: float | None = None, tick=None,
           markers: list[Path] | None = None) -> tuple[int, int]:
    """Wait until all exit 0, or one fails; then (its code, its rank), the others stopped;
    (1, -2) after ``timeout`` seconds; (code, -3) when ``tick()`` returned a code;
    ``markers``: the workers' files that say they finished (a crash after: :func:`_settled`).
    A rank that failed first-hand wins over one whose collective broke (EXIT_PEER). A
    failure of another rank than 0 also waits up to ``GRACE_S`` for rank 0: a failure every
    rank sees at once (a NaN in all-reduced gradients) makes rank 0 print its own diagnostic,
    and stopping it mid-exit would show a second one (rank 0's, then the first rank's)."""
    first: tuple[int, int] | None = None
    deadline, late = None, None if timeout is None else time.monotonic() + timeout
    while True:
        if late is not None and time.monotonic() > late and first is None:
            return 1, -2
        codes = [p.poll() for p in procs]
        if markers is not None:
            codes = [_settled(c, m) for c, m in zip(codes, markers)]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and (first is None or (first[0] == EXIT_PEER and code != EXIT_PEER)):
                first = (code, rank)
                deadline = time.monotonic() + (GRACE_S if code == EXIT_PEER or rank != 0 else 0.0)
        if first is None and all(c == 0 for c in codes):
            return 0, 0
        if first is not None and (time.monotonic() >= deadline or all(c is not None for c in codes)):
            return first
        ended = tick() if tick is not None and first is None else None
        if ended is not None:
            return ended, -3
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen], sig: int, timeout: float) -> None:
    """Send ``sig`` to the workers still running, wait up to ``timeout`` s, then kill."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


_FATAL = {int(getattr(signal, n)) for n in ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL") if hasattr(signal, n)}
_SAID = 20  # how many of a rank's stderr lines (or of its stack) a report of its death by a signal quotes


def _last_words(text: str) -> list[str]:
    """What to quote of a rank killed by a signal: its last lines; after a fatal signal
    that faulthandler caught (:func:`become_worker`), the lines just before Python's
    ``Fatal Python error`` (a C++ library's ``terminate called ...`` and ``what(): ...``)
    and the innermost frames of the thread that died."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Extension modules:")]
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
    if fatal is None:
        return lines[-_SAID:]
    current = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), len(lines))
    return lines[max(fatal - 3, 0):fatal + 1] + lines[current:current + _SAID]


def _report(code: int, rank: int, names: list[str], paths: list[Path]) -> str:
    """What the launcher adds after the run: nothing on success (rank 0's output was shown
    live), else the failing rank's diagnostic (rank 0's was shown already)."""
    text = paths[rank].read_text(encoding="utf-8", errors="replace").rstrip("\n")
    if code == 0:
        return ""
    if code == 130:
        return "interrupted"
    if code < 0:
        name = next((s.name for s in signal.Signals if s == -code), str(-code))
        said = "".join(f"\n  | {line}" for line in _last_words(text)) if rank and -code in _FATAL else ""
        return (f"error: {names[rank]} was killed by {name}" + (f"; the last it said:{said}" if said else "")
                + ("\n  = help: the system may have run out of memory" if -code == signal.SIGKILL else ""))
    if rank == 0 and text:
        return ""
    return text or f"error: {names[rank]} exited with code {code}"


def _ranks_warnings(paths: list[Path], reported: int) -> str:
    """mloc's warnings about a rank's own state said by the ranks other than 0 (whose stderr
    is shown as it comes) and ``reported`` (whose whole stderr is the report): their
    ``warning (rank R of W): ...`` lines (:func:`mloc.shared.warning.line`)."""
    lines = []
    for rank, path in enumerate(paths):
        if rank not in (0, reported) and path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            lines += [s for s in text.splitlines() if s.startswith(RANKED)]
    return "\n".join(lines)


def exit_code(code: int) -> int:
    """A worker's exit code as the run's: a signal or a peer's failure is a failed run."""
    return 1 if code < 0 or code == EXIT_PEER else code
