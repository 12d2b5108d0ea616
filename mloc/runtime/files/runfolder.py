"""Run folders: which folder a run writes into, the lock that keeps it to one owner, and
mloc's own I/O errors (what the folder records: :mod:`mloc.runtime.files.runfiles`). No torch here.

**The rule** (:func:`choose`), for ``mloc run`` and ``python train.py`` alike:

- without ``--resume``: ``--out DIR`` is used if it holds no run (no ``checkpoint.pt``
  and no record in ``metrics.jsonl``: no step was ever trained there); with
  ``--overwrite`` an earlier run there is deleted first. What a start that failed before
  its first step left (``config.json``, an empty ``metrics.jsonl``) is cleared, so the
  new start's ``config.json`` is its own. Without ``--out``, a fresh ``runs/NAME/N`` (``N`` one more than the
  largest there), and ``runs/NAME/latest`` links to it.
- ``--resume DIR`` continues in ``DIR``, unless ``--out`` names another folder: that one
  must hold no run (or ``--overwrite`` is given), and receives a copy of ``DIR``'s
  checkpoint, metrics and config before training continues there; ``DIR`` is left alone.

**The lock** (:class:`RunFolder`, docs/reliability.md): the owner of ``DIR`` is the one
process holding an exclusive ``flock`` on ``DIR/.lock``, from before it looks at the
folder's contents to its end. Taking it is one atomic step of the kernel, also when
``.lock`` is a dead owner's (a killed run's file, taken over in place), and the kernel
drops it when the owner exits, however it exits (a zombie holds nothing). The pid and
start time written into it are for people and for ``mloc runs``. A held lock makes every
other start in ``DIR`` a usage error naming the holder; the rule above is applied again
once the lock is held, so a run that finished in ``DIR`` meanwhile is refused like any.
``--nproc`` workers write under their launcher's lock and check that it still names
their launcher before every checkpoint (:func:`check_owner`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT, METRICS, CONFIG, LOCK = "checkpoint.pt", "metrics.jsonl", "config.json", ".lock"
RUN_FILES = (CHECKPOINT, METRICS, CONFIG)
SHARDS = "checkpoint.shard-*.pt"    # a sharded checkpoint's shards, beside checkpoint.pt (mloc.runtime.program.sharded)


class RunFolderError(Exception):
    """A folder the run may not use (exit 2); ``help`` says what to do."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


class RunIOError(Exception):
    """mloc's own reading or writing failed: ``cannot write PATH: REASON`` (exit 2)."""

    def __init__(self, path: str | os.PathLike, err: OSError | str, verb: str = "write"):
        reason = err if isinstance(err, str) else (err.strerror or str(err))
        super().__init__(f"cannot {verb} {path}: {reason}")
        self.path, self.reason = Path(path), reason


@dataclass(frozen=True)
class Choice:
    """Where a run writes (``dir``), whether it deletes an earlier run there first
    (``clear``, as the folder was when chosen: :class:`RunFolder` decides again under the
    lock), and the folder whose files it copies in first (``copy_from``). ``admit``: the
    folder must hold no run, unless ``overwrite``."""

    dir: Path
    clear: bool = False
    copy_from: Path | None = None
    fresh_root: Path | None = None     # create dir as the next runs/NAME/N under this
    admit: bool = False
    overwrite: bool = False


def holds_run(directory: Path) -> bool:
    """Whether a step was trained in ``directory``: a checkpoint, or a metrics record."""
    directory = Path(directory)
    if (directory / CHECKPOINT).exists():
        return True
    try:
        return (directory / METRICS).stat().st_size > 0
    except OSError:                 # none, or not a folder (reported where it is made)
        return False


def _leftovers(directory: Path) -> bool:
    """Whether ``directory`` holds any of a run's files (a start that trained nothing)."""
    return any((Path(directory) / name).exists() for name in RUN_FILES)


def _same(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def choose(out: Path | None, resume: Path | None, overwrite: bool, name: str,
           root: Path = Path("runs")) -> Choice:
    """Apply the rule (module docstring); raises :class:`RunFolderError`. The folder is
    looked at unlocked, to refuse early; :class:`RunFolder` applies the rule again once
    it holds the lock, and that is the check that counts."""
    if resume is not None and (out is None or _same(out, resume)):
        return Choice(Path(resume))
    if out is None:
        return Choice(root / name, fresh_root=root / name)
    out = Path(out)
    copy_from = Path(resume) if resume else None
    return Choice(out, clear=_admit(out, copy_from, overwrite), copy_from=copy_from, admit=True,
                  overwrite=overwrite)


def _admit(out: Path, resume: Path | None, overwrite: bool) -> bool:
    """Whether ``out`` is to be cleared first (it holds a run, or a failed start's files);
    :class:`RunFolderError` when it holds a run and ``overwrite`` is not given."""
    try:
        if out.exists() and not out.is_dir():
            raise RunIOError(out, os.strerror(errno.ENOTDIR), "use")
        held, left = holds_run(out), _leftovers(out)
    except OSError as e:
        raise RunIOError(e.filename or out, e, "use") from None
    if held and not overwrite:
        what = f"holds another run than {resume}" if resume else "already holds a run"
        raise RunFolderError(f"{out} {what}; it is left as it is",
                             f"continue it with `--resume {out}`, start over there with `--overwrite`, "
                             "or choose another --out")
    return held or left


def _next_folder(root: Path) -> Path:
    """Create ``root/N`` (N one more than the largest number there) and point
    ``root/latest`` at it."""
    root.mkdir(parents=True, exist_ok=True)
    n = max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0) + 1
    while True:
        try:
            (root / str(n)).mkdir()
            break
        except FileExistsError:
            n += 1
    link = root / f".latest.{os.getpid()}.tmp"
    try:
        link.unlink(missing_ok=True)
        link.symlink_to(str(n))
        os.replace(link, root / "latest")
    except OSError:                     # a file system without symbolic links: no `latest`
        link.unlink(missing_ok=True)
    return root / str(n)


class RunFolder:
    """An opened run folder: created, locked by ``owner`` (a pid), the rule applied again
    under the lock, cleaned of temporary files a killed run left, an earlier run deleted
    (``clear``) or a resumed one copied in. A context manager; the lock goes when it
    closes (or when the process ends, however it ends)."""

    def __init__(self, choice: Choice, owner: int | None = None):
        self.owner = owner or os.getpid()
        self._fd: int | None = None
        try:
            self.dir = _next_folder(choice.fresh_root) if choice.fresh_root else choice.dir
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunIOError(e.filename or choice.dir, e, "create") from None
        _test_pause("before")
        self._fd = _take(self.dir, self.owner)
        try:
            clear = _admit(self.dir, choice.copy_from, choice.overwrite) if choice.admit else choice.clear
            self._tidy(clear, choice.copy_from)
        except OSError as e:
            self.close()
            raise RunIOError(e.filename or self.dir, e) from None
        except BaseException:
            self.close()
            raise

    def _tidy(self, clear: bool, copy_from: Path | None) -> None:
        for tmp in self.dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        if clear:
            for name in (*RUN_FILES, *(p.name for p in self.dir.glob(SHARDS))):
                (self.dir / name).unlink(missing_ok=True)
        if copy_from is not None:                   # the shards first: checkpoint.pt names them
            for name in (*sorted(p.name for p in copy_from.glob(SHARDS)), *RUN_FILES):
                if (copy_from / name).is_file():
                    shutil.copyfile(copy_from / name, self.dir / f".{name}.copy.tmp")
                    os.replace(self.dir / f".{name}.copy.tmp", self.dir / name)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _release(self.dir, fd)

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the lock ------------------------------------------------------------------------------
#
# Ownership of DIR is an exclusive ``flock`` on the file at DIR/.lock, held by the owner for
# the run's life. The kernel grants it to one open file at a time, so taking a free or a
# dead owner's lock is one atomic step, and it drops the lock when the owner's last
# descriptor closes: at exit, however the process ended, before it is a zombie. The pid and
# start time in the file are for people (and `check_owner`); they decide nothing.

_HELD: set[int] = set()             # the lock descriptors this process holds


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) closes its copies of the lock descriptors, so
    the lock lives exactly as long as the process that took it."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _test_pause(point: str) -> None:
    """Test hook, no effect otherwise: ``MLOC_TEST_LOCK_WAIT=POINT:GATE[,POINT:GATE]`` makes
    this process, on reaching POINT (``before``: chosen, lock not tried; ``open``: .lock
    opened, not locked; ``locked``: locked, pid not written; ``held``: taken), create
    ``GATE.reached`` and wait until GATE exists, so a test can widen a window of the
    protocol deterministically (tests/run/test_run_lock.py)."""
    for item in filter(None, os.environ.get("MLOC_TEST_LOCK_WAIT", "").split(",")):
        name, _, gate = item.partition(":")
        if name == point and gate:
            Path(gate + ".reached").write_text(str(os.getpid()))
            while not os.path.exists(gate):
                time.sleep(0.01)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a live owner
    from another process that reused its pid; None where /proc is not there."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` runs (started at ``started``, when known): not gone, not a zombie (a
    process that exited and waits for its parent to reap it is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True                     # no /proc: kill(0) is all there is
    return fields[0] not in ("Z", "X") and (started is None or fields[19] == started)


def _read_lock(directory: Path) -> tuple[int, str | None] | None:
    try:
        fields = (Path(directory) / LOCK).read_text().split()
        return int(fields[0]), (fields[1] if len(fields) > 1 and fields[1] != "-" else None)
    except (OSError, ValueError, IndexError):
        return None


def _is_held(fd: int) -> bool:
    """Whether another open file holds the exclusive lock on ``fd``'s file. The probe is a
    shared lock, dropped at once: it never blocks an owner, and a start that meets it
    tries again (:func:`_take`)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def lock_owner(directory: Path) -> int | None:
    """The pid of the process that holds ``directory``'s lock; None when none holds it
    (no ``.lock``, or a dead owner's). A holder that has not written its pid yet (it took
    the lock a moment ago) is waited for a second, then reported as 0."""
    try:
        fd = os.open(Path(directory) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        for _ in range(100):
            if not _is_held(fd):
                return None
            held = _read_lock(directory)
            if held is not None and _alive(*held):
                return held[0]
            time.sleep(0.01)
        return 0
    except OSError:                     # a file system without locks: nobody can hold one
        return None
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names ``fd``'s file (a closing owner unlinks .lock)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _take(directory: Path, owner: int) -> int:
    """Lock ``directory`` for ``owner``: returns the descriptor that holds the lock, or
    raises :class:`RunFolderError` naming the live owner. A dead owner's ``.lock`` is taken
    over in place; a file that a closing owner unlinked meanwhile is let go of and the
    one now at the path is tried."""
    path = directory / LOCK
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunIOError(path, e) from None
        try:
            _test_pause("open")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = lock_owner(directory)
                if held is not None:
                    who = f"process {held}" if held else "another process (it is starting)"
                    raise RunFolderError(f"{directory} is in use by {who} (see {path})",
                                         "wait for that run to finish or stop it; choose another --out "
                                         "to start a separate run") from None
                time.sleep(0.01)        # released meanwhile, or another start's probe
                os.close(fd)
                continue
            if not _same_file(fd, path):
                os.close(fd)
                continue
            _test_pause("locked")
            text = f"{owner} {_start_time(owner) or '-'}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        except OSError as e:
            os.close(fd)
            raise RunIOError(path, e, "lock") from None
        except BaseException:
            os.close(fd)
            raise
        _HELD.add(fd)
        _test_pause("held")
        return fd
    raise RunFolderError(f"{directory} is being locked by other processes at the same time", None)


def _release(directory: Path, fd: int) -> None:
    """Unlink ``.lock`` while still holding it, then let go: a start that opened the file
    in between finds it unlinked (:func:`_same_file`) and tries the path again."""
    try:
        if _same_file(fd, directory / LOCK):
            (directory / LOCK).unlink(missing_ok=True)
    finally:
        _HELD.discard(fd)
        os.close(fd)


@contextmanager
def held(directory: Path, owner: int | None = None):
    """Hold ``directory``'s lock (the protocol above: one holder, dropped by the kernel
    however the holder ends) for the ``with`` block, for a folder that is not a run's:
    `mloc sweep`'s, so that two sweeps never run the same points. Raises
    :class:`RunFolderError` naming the live holder."""
    fd = _take(Path(directory), owner or os.getpid())
    try:
        yield
    finally:
        _release(Path(directory), fd)


def check_owner(directory: Path, owner: int) -> None:
    """Raise :class:`RunFolderError` unless ``directory/.lock`` names ``owner``, alive (the
    ``--nproc`` workers' check that their launcher still owns the folder)."""
    held = _read_lock(directory)
    if held is None or held[0] != owner or not _alive(*held):
        raise RunFolderError(f"{directory} is no longer locked by this run's launcher (process {owner}); "
                             "stopping before writing into it", "start the run again")
