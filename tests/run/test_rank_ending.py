"""How a rank ends (:func:`mloc.runtime.processes.ending.end_rank`): its exit handlers run,
its output is flushed, its exit code is kept, and the interpreter is not finalized, where a
thread still inside torch dies by ``std::terminate``.

CI saw it as "terminate called without an active exception" and a rank killed by SIGABRT
after its run (``test_fsdp_hypergrad``, ``test_nproc_failures``, ``test_fsdp_run``, a few
times in a few hundred multi-process runs): there the thread is one of gloo's, letting go
of a collective the main thread had already waited for. That race is microseconds wide;
the daemon thread below, busy in torch when the process exits, shows the same death every
time (pytorch/pytorch#38228)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BUSY = """
import sys, threading, torch
inside = threading.Event()
def busy():
    a = torch.randn(1_000_000)
    while True:
        a + a                   # torch lets go of the GIL here and takes it back after
        inside.set()
threading.Thread(target=busy, daemon=True).start()
inside.wait()                   # the thread is in its loop, however loaded the machine
if sys.argv[1] == "end_rank":
    from mloc.runtime.processes.ending import end_rank
    end_rank(0)
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="from 3.14 such a thread hangs at exit (CPython gh-87135)")
def test_a_thread_inside_torch_at_finalization_aborts_the_process():
    """The death end_rank avoids: an ordinary exit, a thread busy in torch."""
    proc = _python(BUSY, "exit")
    assert proc.returncode == -6, (proc.returncode, proc.stderr)
    assert "terminate called without an active exception" in proc.stderr


def test_end_rank_ends_without_finalization():
    proc = _python(BUSY, "end_rank")
    assert proc.returncode == 0, proc.stderr
    assert "terminate called" not in proc.stderr


def test_end_rank_runs_the_exit_handlers_flushes_and_keeps_the_code(tmp_path):
    code = f"""
import atexit, sys
from mloc.runtime.processes.ending import end_rank
atexit.register(lambda: open({str(tmp_path / 'handler')!r}, "w").write("ran"))
class Finalized:
    def __del__(self):
        open({str(tmp_path / 'finalized')!r}, "w").write("ran")
kept = Finalized()
sys.stdout.write("no newline, still buffered")
end_rank(7)
"""
    proc = _python(code)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert (tmp_path / "handler").read_text() == "ran"
    assert not (tmp_path / "finalized").exists()        # what finalization alone does is skipped, as documented
