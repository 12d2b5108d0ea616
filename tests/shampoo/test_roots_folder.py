"""Shampoo's asynchronous roots leave nothing in ``/dev/shm`` that a later start does not
remove (issue 23, point 7). The shared folder is named by the training process
(``mloc-roots-PID-START-*``, :mod:`mloc.runtime.files.scratch`); a SIGKILL of the whole process
group (the training process and its root worker) leaves it, as nothing can remove it
then, and the next start of a root worker removes every such folder whose owner is dead.

Before (commit 0f0014f): the folder was ``mloc-roots-RANDOM``, and every SIGKILL of the
group left one more, empty, for good. Other runs on the machine may have folders of their
own there at the same time: the test looks only at the ones its own runs made. Slow tier:
two runs, one of them killed mid-run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.run.helpers import alive, descendants, popen, step_of

HERE = Path(__file__).resolve().parent
SHM = Path("/dev/shm")
ASYNC = ("--set", "net.optimizer.async_roots=true", "--set", "net.optimizer.staleness=1")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (SHM.is_dir() and os.access(SHM, os.W_OK)), reason="no writable /dev/shm")]


def folders_of(pid: int) -> list[Path]:
    return sorted(SHM.glob(f"mloc-roots-{pid}-*"))


def test_a_killed_groups_root_folder_is_removed_by_the_next_start(tmp_path):
    before = set(SHM.glob("mloc-roots-*"))
    proc = popen("run", HERE / "shampoo_nproc.mlo", "--steps", 100000, "--out", tmp_path / "a", "--quiet", *ASYNC)
    deadline = time.time() + 240
    while step_of(tmp_path / "a") < 6:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    group = descendants(proc.pid) | {proc.pid}
    os.killpg(proc.pid, signal.SIGKILL)         # the training process and its root worker at once
    proc.wait(timeout=30)
    deadline = time.time() + 10
    while any(alive(p) for p in group) and time.time() < deadline:
        time.sleep(0.05)
    left = folders_of(proc.pid)                 # named by its dead owner: found by the next start
    assert left and set(left) <= set(SHM.glob("mloc-roots-*")) - before, sorted(set(SHM.glob("mloc-roots-*")) - before)
    second = popen("run", HERE / "shampoo_nproc.mlo", "--steps", 8, "--out", tmp_path / "b", "--quiet", *ASYNC)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert not any(p.exists() for p in left)
    assert folders_of(second.pid) == []         # and a run that ends removes its own
