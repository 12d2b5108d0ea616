"""Scratch folders that name their owner, so that a later start removes what a killed one left.

mloc keeps some files outside the run folder while a run is going: the ``--nproc`` and
``--pipeline`` launchers' worker logs (in the temporary directory) and Shampoo's shared
root buffers (in ``/dev/shm``). The owner removes its folder when it is done, but a
SIGKILL (of the owner, or of its whole process group) runs no clean-up. So every such
folder is named

    PREFIX-PID-START-RANDOM

where PID and START identify the process that made it: START is the process's start time
in clock ticks since boot (``/proc/PID/stat``, field 22), the same identity the run
folder's lock uses (:mod:`mloc.runtime.files.runfolder`), so a pid the kernel has reused since
does not keep a dead owner's folder alive. :func:`make` first removes every
``PREFIX-*`` folder under the same parent whose owner is dead (:func:`sweep`), then makes
the new one. Nothing is left behind for longer than until the next start, and a live
run's folder is never touched. Folders of an older mloc (``PREFIX-RANDOM``, no owner) are
left alone: nothing says whether their owner is alive.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mloc.runtime.files.runfolder import _alive, _start_time


def _owner(name: str, prefix: str) -> tuple[int, str | None] | None:
    """``(pid, start time)`` from a folder name ``PREFIX-PID-START-RANDOM``; None for
    another name (another prefix, an older mloc's folder)."""
    if not name.startswith(prefix + "-"):
        return None
    fields = name[len(prefix) + 1:].split("-")
    if len(fields) < 3 or not fields[0].isdigit():
        return None
    return int(fields[0]), (None if fields[1] == "x" else fields[1])


def sweep(prefix: str, parent: Path) -> list[Path]:
    """Remove the ``PREFIX-*`` folders under ``parent`` whose owner is dead; the removed."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        owner = _owner(entry.name, prefix)
        if owner is None or _alive(*owner) or not entry.is_dir(follow_symlinks=False):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def make(prefix: str, parent: Path | None = None) -> Path:
    """A new folder ``PREFIX-PID-START-RANDOM`` of this process under ``parent`` (default:
    the temporary directory), after :func:`sweep` removed the dead owners' folders there."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    sweep(prefix, parent)
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{pid}-{_start_time(pid) or 'x'}-", dir=parent))


@contextmanager
def folder(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """:func:`make`, removed (with what it holds) when the body ends."""
    path = make(prefix, parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
