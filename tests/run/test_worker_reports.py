"""What the launcher reports when a worker dies by a signal
(:func:`mloc.runtime.processes.workers.supervise`): the rank, the signal, and the last lines
the rank wrote to its stderr; for a C++ abort that is the library's own message and, through
:func:`mloc.runtime.processes.workers.become_worker`'s faulthandler, every thread's Python
stack. Before, the report was one line (``error: rank 1 of 2 was killed by SIGABRT``) and the
rank's stderr was deleted with the launcher's scratch folder, so nothing said why."""

from __future__ import annotations

import os
import sys

from mloc.runtime.processes.workers import supervise

# rank 1 writes what a C++ std::terminate writes, then aborts; rank 0 waits to be stopped
ABORTING = """
import sys, time
from mloc.runtime.processes.workers import become_worker
become_worker()
if sys.argv[1] == "1":
    sys.stderr.write("terminate called after throwing an instance of 'gloo::IoException'\\n")
    sys.stderr.flush()
    def deep_in_a_collective():
        import os; os.abort()
    deep_in_a_collective()
time.sleep(60)
"""


def _supervise(code: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return supervise([[sys.executable, "-c", code, str(r)] for r in range(2)], [env, env],
                     ["rank 0 of 2", "rank 1 of 2"], timeout=60)


def test_a_rank_killed_by_sigabrt_is_reported_with_what_it_said_and_its_stack():
    out = _supervise(ABORTING)
    assert out.code != 0
    lines = out.report.splitlines()
    assert lines[0] == "error: rank 1 of 2 was killed by SIGABRT; the last it said:", out.report
    assert all(line.startswith("  | ") for line in lines[1:]), out.report
    assert "Fatal Python error: Aborted" in out.report, out.report
    assert "deep_in_a_collective" in out.report, out.report     # faulthandler's stack of the main thread
    assert "gloo::IoException" in out.report and len(lines) <= 25, out.report


def test_a_rank_killed_without_a_word_is_reported_in_one_line():
    out = _supervise("import os, sys, time\nif sys.argv[1] == '1': os.abort()\ntime.sleep(60)")
    assert out.report == "error: rank 1 of 2 was killed by SIGABRT", out.report


def test_a_rank_killed_from_outside_is_reported_without_its_last_words():
    """SIGKILL (the OOM killer, a user's kill): what the rank said last is unrelated."""
    out = _supervise("import os, signal, sys, time\nsys.stderr.write('a warning\\n'); sys.stderr.flush()\n"
                     "if sys.argv[1] == '1': os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)")
    assert out.report == ("error: rank 1 of 2 was killed by SIGKILL\n"
                          "  = help: the system may have run out of memory"), out.report


# both ranks finish their run; rank 1 then crashes in its teardown (as a library's
# destructor can, at interpreter exit)
CRASHING_AT_EXIT = """
import os, sys
from mloc.runtime.processes.workers import become_worker, finished
become_worker()
code = finished(0)
if sys.argv[1] == "1":
    sys.stderr.write("terminate called without an active exception\\n"); sys.stderr.flush()
    os.abort()
sys.exit(code)
"""


def test_a_crash_after_the_run_finished_is_a_warning_and_the_run_succeeds():
    out = _supervise(CRASHING_AT_EXIT)
    assert out.code == 0, out
    lines = out.report.splitlines()
    assert lines[0] == ("warning: rank 1 of 2 crashed while exiting (killed by SIGABRT) after its run had "
                        "finished: the run is complete and its files are written; the last it said:"), out.report
    assert "  | terminate called without an active exception" in lines, out.report


def test_a_worker_that_did_not_finish_is_a_failure_even_if_another_did():
    code = CRASHING_AT_EXIT.replace("code = finished(0)", "code = finished(0) if sys.argv[1] == '0' else 0")
    out = _supervise(code)
    assert out.code == -6 and out.report.startswith("error: rank 1 of 2 was killed by SIGABRT; the last it said:"), out


def test_a_failed_run_is_not_said_to_have_finished(tmp_path, monkeypatch):
    """``finished`` marks a run that ended 0 only."""
    from mloc.runtime.processes.workers import FINISHED_VAR, finished
    monkeypatch.setenv(FINISHED_VAR, str(tmp_path / "r.finished"))
    assert finished(1) == 1 and not (tmp_path / "r.finished").exists()
    assert finished(0) == 0 and (tmp_path / "r.finished").exists()
