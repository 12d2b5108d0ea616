"""The default thread count (issue 22, item 12): on a busy 2-core machine torch's default (one
thread per core) ran a small program at 2.7 steps/s against 123 with `--threads 1`. The rule
is a pure function of the cores, the load, the program's largest parameter tensor and
`OMP_NUM_THREADS` (`mloc.runtime.processes.threads.choose`); the banner shows the count and its reason,
config.json records both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mloc.runtime.processes.threads import GRAIN_SIZE, Threads, choose
from tests.conftest import ROOT
from tests.run.helpers import SMALL

BIG = 10 * GRAIN_SIZE


@pytest.mark.parametrize("cores, load, largest, nproc, env, expect", [
    (2, 6.5, BIG, 1, None, Threads(1, "the machine is busy: load 6.5 on 2 cores")),       # the cliff
    (2, 1.2, BIG, 1, None, Threads(1, "the machine is busy: load 1.2 on 2 cores")),
    (2, 0.3, BIG, 1, None, Threads(2, "2 of 2 cores idle (load 0.3)")),                    # a quiet machine
    (16, 3.6, BIG, 1, None, Threads(12, "12 of 16 cores idle (load 3.6)")),
    (16, 3.6, BIG, 4, None, Threads(3, "12 of 16 cores idle (load 3.6), divided among 4 processes")),
    (16, 15.0, BIG, 4, None, Threads(1, "the machine is busy: load 15.0 on 16 cores")),
    (16, 0.0, BIG, 32, None, Threads(1, "16 of 16 cores idle (load 0.0), divided among 32 processes")),
    (1, 0.0, BIG, 1, None, Threads(1, "1 of 1 core idle (load 0.0)")),
    (16, None, BIG, 2, None, Threads(8, "16 cores for 2 processes, the load unknown")),
])
def test_the_count_follows_the_idle_cores(cores, load, largest, nproc, env, expect):
    assert choose(cores, load, largest, nproc, env) == expect


def test_a_small_program_gets_one_thread_however_idle_the_machine():
    chosen = choose(64, 0.0, GRAIN_SIZE - 1)
    assert chosen.count == 1 and f"{GRAIN_SIZE - 1} elements, under torch's {GRAIN_SIZE}" in chosen.reason
    assert choose(64, 0.0, GRAIN_SIZE).count == 64


def test_omp_num_threads_wins_over_the_rule():
    assert choose(16, 15.0, 10, env="4", torch_default=4) == Threads(4, "OMP_NUM_THREADS=4")
    assert choose(2, 0.0, BIG, env=" ", torch_default=2) == Threads(2, "2 of 2 cores idle (load 0.0)")


def mloc_without_omp(*argv) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-m", "mloc", *map(str, argv)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_the_banner_and_config_show_the_choice_and_its_reason(tmp_path):
    """small.mlo's largest tensor is Linear(4, 8)'s weight: 32 elements, so 1 thread on any
    machine (whatever its load); with --threads the banner says no reason."""
    proc = mloc_without_omp("run", SMALL, "--steps", 2, "--out", tmp_path / "auto")
    assert proc.returncode == 0, proc.stderr
    reason = f"a small program: its largest parameter tensor has 32 elements, under torch's {GRAIN_SIZE} per thread"
    assert f", 1 thread ({reason}), nproc 1, compile auto ->" in proc.stderr, proc.stderr
    record = json.loads((tmp_path / "auto" / "config.json").read_text())["run"]
    assert record["threads"] == 1 and record["threads_reason"] == reason
    given = mloc_without_omp("run", SMALL, "--steps", 2, "--out", tmp_path / "given", "--threads", 2)
    assert given.returncode == 0 and ", 2 threads, nproc 1, compile auto ->" in given.stderr, given.stderr
    assert json.loads((tmp_path / "given" / "config.json").read_text())["run"]["threads"] == 2
