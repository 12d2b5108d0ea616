"""Run folders: which folder a run writes into, the lock that keeps it to one owner, what
it records, and mloc's own I/O errors. No torch here.

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

**The lock** (:class:`RunFolder`): ``DIR/.lock`` holds the owner's pid and start time.
A live owner makes every other start in ``DIR`` a usage error; a dead owner's lock (a
killed run) is taken over. ``--nproc`` workers write under their launcher's lock and
check that it still names their launcher before every checkpoint
(:func:`check_owner`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT, METRICS, CONFIG, LOCK = "checkpoint.pt", "metrics.jsonl", "config.json", ".lock"
RUN_FILES = (CHECKPOINT, METRICS, CONFIG)


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
    (``clear``), and the folder whose files it copies in first (``copy_from``)."""

    dir: Path
    clear: bool = False
    copy_from: Path | None = None
    fresh_root: Path | None = None     # create dir as the next runs/NAME/N under this


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
    """Apply the rule (module docstring); raises :class:`RunFolderError`."""
    if resume is not None and (out is None or _same(out, resume)):
        return Choice(Path(resume))
    if out is None:
        return Choice(root / name, fresh_root=root / name)
    out = Path(out)
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
    return Choice(out, clear=held or left, copy_from=Path(resume) if resume else None)


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
    """An opened run folder: created, locked by ``owner`` (a pid), cleaned of temporary
    files a killed run left, an earlier run deleted (``clear``) or a resumed one copied
    in. A context manager; the lock goes when it closes."""

    def __init__(self, choice: Choice, owner: int | None = None):
        self.owner = owner or os.getpid()
        try:
            self.dir = _next_folder(choice.fresh_root) if choice.fresh_root else choice.dir
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunIOError(e.filename or choice.dir, e, "create") from None
        _lock(self.dir, self.owner)
        try:
            self._tidy(choice)
        except OSError as e:
            self.close()
            raise RunIOError(e.filename or self.dir, e) from None

    def _tidy(self, choice: Choice) -> None:
        for tmp in self.dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        if choice.clear:
            for name in RUN_FILES:
                (self.dir / name).unlink(missing_ok=True)
        if choice.copy_from is not None:
            for name in RUN_FILES:
                if (choice.copy_from / name).is_file():
                    shutil.copyfile(choice.copy_from / name, self.dir / f".{name}.copy.tmp")
                    os.replace(self.dir / f".{name}.copy.tmp", self.dir / name)

    def close(self) -> None:
        if lock_owner(self.dir) == self.owner:
            (self.dir / LOCK).unlink(missing_ok=True)

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the lock ------------------------------------------------------------------------------

def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a live owner
    from another process that reused its pid; None where /proc is not there."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return started is None or _start_time(pid) in (None, started)


def _read_lock(directory: Path) -> tuple[int, str | None] | None:
    try:
        fields = (Path(directory) / LOCK).read_text().split()
        return int(fields[0]), (fields[1] if len(fields) > 1 and fields[1] != "-" else None)
    except (OSError, ValueError, IndexError):
        return None


def lock_owner(directory: Path) -> int | None:
    """The pid in ``directory/.lock`` if that process is alive, else None."""
    held = _read_lock(directory)
    return held[0] if held is not None and _alive(*held) else None


def _lock(directory: Path, owner: int) -> None:
    path = directory / LOCK
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = lock_owner(directory)
            if held is not None and held != owner:
                raise RunFolderError(f"{directory} is in use by process {held} (see {path})",
                                     "wait for that run to finish or stop it; choose another --out "
                                     "to start a separate run") from None
            path.unlink(missing_ok=True)       # a killed run's lock (or our own)
            continue
        except OSError as e:
            raise RunIOError(path, e) from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{owner} {_start_time(owner) or '-'}\n")
        return
    raise RunFolderError(f"{directory} is being locked by another process at the same time", None)


def check_owner(directory: Path, owner: int) -> None:
    """Raise :class:`RunFolderError` unless ``directory/.lock`` names ``owner``, alive."""
    held = _read_lock(directory)
    if held is None or held[0] != owner or not _alive(*held):
        raise RunFolderError(f"{directory} is no longer locked by this run's launcher (process {owner}); "
                             "stopping before writing into it", "start the run again")


# --- what the folder records --------------------------------------------------------------

def write_config(directory: Path, record: dict) -> None:
    """``config.json``: the first start's ``record`` under "run", each resume's appended
    to "resumes"."""
    path = Path(directory) / CONFIG
    try:
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        old = None
    data = {"run": record, "resumes": []} if not isinstance(old, dict) or "run" not in old else \
        {**old, "resumes": list(old.get("resumes", [])) + [record]}
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def amend_config(directory: Path, **fields) -> None:
    """Add ``fields`` to the record of the latest start in ``config.json`` (what is known
    only once the program is built: the threads chosen for it); nothing without the file."""
    path = Path(directory) / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict) or not isinstance(data.get("run"), dict):
        return
    latest = data["resumes"][-1] if data.get("resumes") else data["run"]
    latest.update(fields)
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temporary file, then a rename); :class:`RunIOError`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunIOError(path, e) from None


def truncate_metrics(directory: Path, step: int) -> None:
    """Keep the records of ``metrics.jsonl`` up to ``step`` (those a resume from a
    step-``step`` checkpoint repeats go), so the file stays one history; none for step 0."""
    path = Path(directory) / METRICS
    if not path.is_file():
        return
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except OSError as e:
        raise RunIOError(path, e, "read") from None
    keep = [line for line in lines if line.endswith("\n") and _step(line) is not None and _step(line) <= step]
    if step == 0:
        keep = []
    if keep != lines:
        write_text(path, "".join(keep))


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
