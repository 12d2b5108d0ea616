"""How a rank of a distributed job ends: its exit handlers, then ``os._exit``, never the
interpreter's finalization.

**Why.** Under Python before 3.14, a thread that asks for the GIL while the interpreter is
being finalized is ended with ``pthread_exit``. On glibc that unwinds the thread's stack,
and unwinding through a C++ destructor (``noexcept``) calls ``std::terminate``: the process
prints "terminate called without an active exception" and dies by SIGABRT, after a run
that was complete (pytorch/pytorch#38228; CPython gh-87135 makes such a thread hang
instead, from 3.14). A rank meets this when one of gloo's worker threads lets go of a
finished collective just after the main thread, which waited for it, has gone on to exit:
the collective's tensors have Python objects, and freeing them takes the GIL. The window
is microseconds wide, so it shows on a loaded machine, about once in a few hundred
multi-process runs, and more with FSDP's many collectives.

**What a rank does instead** (:func:`end_rank`), once its run has returned its exit code:
it runs the exit handlers itself, while the interpreter is whole (mloc's leaves the
process group there, :func:`mloc.runtime.base.distributed.DistContext.connect`; logging
and multiprocessing close theirs), flushes its standard streams, and ends with
``os._exit``: no finalization, so no thread is left to ask for the GIL. What mloc writes is
closed by then (files are written whole and renamed into place). What finalization alone
would have done is skipped: a ``__del__`` of an object still alive, such as a file the
user's code left open, does not run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def end_rank(code: int) -> NoReturn:
    """End this process with ``code`` after its exit handlers, without finalization."""
    atexit._run_exitfuncs()     # noqa: SLF001 - the stdlib's way to run them now (a failing one is reported, the rest run)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):    # a closed or broken stream: nothing left to say
            stream.flush()
    os._exit(code)
