"""mloc's own warnings: one category, and how they are said where mloc owns the terminal.

Every warning mloc itself gives is an :class:`MlocWarning` (a ``UserWarning``) issued by
``warnings.warn``, so Python's filters treat it as any other:
``warnings.simplefilter("error", MlocWarning)`` turns it into an error, ``python -W
"error:the data of"`` (or ``PYTHONWARNINGS``) does so by the message's start (a ``-W``
category is resolved at start-up, before site-packages is on the path, so only built-in
categories can be named there), ``pytest.warns(MlocWarning)`` and
``warnings.catch_warnings`` see it, and the default filter says each once per place in the
code.

Where mloc owns the terminal (the ``mloc`` command, a run's training processes, a pipeline
stage) :func:`shown` replaces ``warnings.showwarning`` for its duration: a warning that the
filters let through is one line, ``warning: TEXT``, in the voice of mloc's other notes, not
Python's ``FILE:LINE: UserWarning: TEXT`` and the source line (a place in mloc's code the user
cannot act on). Any other warning (the user's code, torch) is passed on to the
``showwarning`` it replaced, in Python's format. In a run of several processes a warning
about what every rank does alike is said by rank 0 alone; one about a rank's own state
(``every_rank``: its Shampoo root worker, its files), or any in a run whose ranks differ (a
pipeline's stages), by each rank, naming it: ``warning (rank 1 of 2): TEXT``. (The ``--nproc``
launcher shows rank 0's stderr as it comes and the other ranks' warnings when they end:
:mod:`mloc.runtime.processes.workers`.) No torch here, and nothing else of mloc.
"""

from __future__ import annotations

import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["MlocWarning", "shown", "line", "RANKED"]

RANKED = "warning (rank "
"""How a rank's own warning begins (the ``--nproc`` launcher picks them out of its workers' stderr)."""


class MlocWarning(UserWarning):
    """A warning of mloc's own; ``every_rank``: about this process's own state, so said by
    each rank of a run of several (otherwise by rank 0 alone: every rank would say the same)."""

    def __init__(self, text: str, every_rank: bool = False):
        super().__init__(text)
        self.every_rank = every_rank

    def __reduce__(self):
        return type(self), (str(self), self.every_rank)


def line(message, rank: int | None = None, world: int = 1, alike: bool = True) -> str | None:
    """The line ``message`` (an :class:`MlocWarning`, or its text) is said as by ``rank`` of
    ``world`` processes (``rank`` None: the only one, or a launcher; ``alike``: the ranks run
    the same program on their shards), or None when rank 0 says it for every rank."""
    if rank is None or world <= 1:
        return f"warning: {message}"
    if getattr(message, "every_rank", False) or not alike:
        return f"{RANKED}{rank} of {world}): {message}"
    return f"warning: {message}" if rank == 0 else None


_lock = threading.Lock()
_writers: list[Callable[[str], None]] = []      # the innermost :func:`shown`'s writer last


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@contextmanager
def shown(rank: int | None = None, world: int = 1, alike: bool = True, write: Callable[[str], None] | None = None,
          record: Callable[[str], None] | None = None) -> Iterator[None]:
    """For the duration, an :class:`MlocWarning` the filters let through is said as
    :func:`line` says (by ``rank`` of ``world``, ``alike``), through ``write`` (default: the enclosing
    :func:`shown`'s, else stderr), and passed to ``record`` (where the run records it) when
    this process says it; any other warning goes to the ``showwarning`` this replaced."""
    previous = warnings.showwarning
    out = write or (_writers[-1] if _writers else _stderr)

    def show(message, category, filename, lineno, file=None, source=None):
        if not issubclass(category, MlocWarning):
            return previous(message, category, filename, lineno, file, source)
        text = line(message, rank, world, alike)
        if text is None:
            return None
        with _lock:
            out(text)
            if record is not None:
                record(str(message))
        return None

    warnings.showwarning = show
    _writers.append(out)
    try:
        yield
    finally:
        _writers.pop()
        warnings.showwarning = previous
