"""Scratch folders name their owner (pid and start time), and a start removes the ones
whose owner is dead, never a live one's (:mod:`mloc.runtime.files.scratch`; issue 23, point 7:
the ``--nproc``/``--pipeline`` launchers' log folders and Shampoo's ``/dev/shm`` roots)."""

from __future__ import annotations

import os
import subprocess
import sys

from mloc.runtime.files import scratch
from mloc.runtime.files.runfolder import _start_time


def test_a_start_removes_the_folders_of_dead_owners_and_only_those(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    me, started = os.getpid(), _start_time(os.getpid())
    names = {
        "dead": f"mloc-roots-{dead_pid}-123-abc",               # its owner has exited
        "reused": f"mloc-roots-{me}-{int(started or 0) + 1}-abc",  # this pid, another start: a reused pid
        "live": f"mloc-roots-{me}-{started}-abc",                # this process's own
        "old": "mloc-roots-k2j4h5",                              # an older mloc's: no owner in the name
        "other": f"mloc-workers-{dead_pid}-123-abc",             # another prefix
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "stats0").write_bytes(b"x")
    made = scratch.make("mloc-roots", tmp_path)
    assert made.name.startswith(f"mloc-roots-{me}-{started}-") and made.is_dir()
    kept = {p.name for p in tmp_path.iterdir()}
    assert kept == {names["live"], names["old"], names["other"], made.name}
    with scratch.folder("mloc-workers", tmp_path) as logs:
        assert logs.is_dir() and not (tmp_path / names["other"]).exists()
    assert not logs.exists()
