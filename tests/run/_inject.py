"""Run `mloc ARGS` with a fault injected into the N-th checkpoint write (for the tests):

    python -m tests.run._inject MODE N ARGS...       (`mloc ARGS`)
    python -m tests.run._inject MODE N train.py ARGS...   (a compiled program)

MODE: `enospc` (the disk fills up halfway through the file: ENOSPC, as the kernel reports
it), `kill-mid` (SIGKILL halfway through the file), `kill-before-rename` (the temporary
file complete and synced, not yet renamed), `kill-after-rename` (renamed, the directory
not yet synced). Only the `os` that `mloc.runtime.program.checkpoint` sees is wrapped."""

from __future__ import annotations

import errno
import os
import runpy
import signal
import sys

import mloc.runtime.program.checkpoint as checkpoint
from mloc.cli import main

MODE, N = sys.argv[1], int(sys.argv[2])
COUNT = {"n": 0}


def _due(*modes: str) -> bool:
    return MODE in modes and COUNT["n"] == N


class _File:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        if _due("enospc", "kill-mid"):
            half = memoryview(data)[: len(data) // 2]
            self._f.write(half)
            self._f.flush()
            if MODE == "kill-mid":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class _Os:
    def __getattr__(self, name):
        return getattr(os, name)

    def fdopen(self, fd, *args, **kw):
        COUNT["n"] += 1
        return _File(os.fdopen(fd, *args, **kw))

    def replace(self, src, dst):
        if _due("kill-before-rename"):
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace(src, dst)
        if _due("kill-after-rename"):
            os.kill(os.getpid(), signal.SIGKILL)


checkpoint.os = _Os()
if sys.argv[3].endswith(".py"):
    sys.argv = sys.argv[3:]
    runpy.run_path(sys.argv[0], run_name="__main__")
sys.exit(main(sys.argv[3:]))
