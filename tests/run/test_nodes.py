"""A run on two "machines" on loopback (issue 26): two `mloc run --nnodes 2` launchers, each
with its own workers, meeting at 127.0.0.1:PORT; and `train.py` under a plain two-node
torchrun and under SLURM's srun variables. Every run here starts several processes: slow tier.

What must hold, as on one machine: the result equals `--nproc 2` on one machine, bitwise,
not within a tolerance: the ranks are numbered as on one machine, so every rank draws the
same shard and gloo's all-reduce (whose schedule depends on the ranks and the world size,
not on which host a rank is on) adds the same numbers in the same order; for two ranks
it is one addition, whose result does not depend on the order anyway. Two machines of two
processes likewise end bitwise where `--nproc 4` does (the resume test). Node 1 writes
nothing in the run folder and leaves no scratch folder; the SIGKILL of one machine's
launcher ends the run on the other with one report and exit 1, no process left, and a
checkpoint that `--resume` on both machines continues bitwise; Ctrl-C on either machine
stops the whole run with a checkpoint. No assertion is on time: the timeouts only stop a
hang (the machine has 2 cores shared with other jobs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mloc.runtime.processes.workers import free_port
from tests.conftest import ROOT
from tests.run.helpers import (ENV, FAULTY, SMALL, alive, default_signals, descendants, mloc, records, same_state,
                               step_of)

QUIET = ("--threads", 1, "--compile", "off", "--quiet")
SLOW_LOSS = ("--set", "weights.loss=lib.ce_slow(net, batch, seconds=0.02)")


def start(argv, tmp: Path) -> subprocess.Popen:
    """A child in a session of its own (signalled as a terminal would), with its own TMPDIR
    (where a machine's scratch folder goes)."""
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([str(a) for a in argv], cwd=ROOT, env={**ENV, "TMPDIR": str(tmp)}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals)


def machines(program, nproc: int, *argv, tmp: Path) -> list[subprocess.Popen]:
    """`mloc run PROGRAM --nnodes 2 --node-rank R` for R = 1, 0, meeting on a free port."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [start([sys.executable, "-m", "mloc", "run", program, "--nnodes", 2, "--node-rank", rank, "--nproc", nproc,
                   "--rdzv-endpoint", endpoint, *argv], tmp / f"node{rank}") for rank in (0, 1)]


def finish(procs, timeout: float = 300) -> list[str]:
    """Each process's stderr, once all exited (killed after `timeout`: a hang fails the test)."""
    errs = []
    for p in procs:
        try:
            errs.append(p.communicate(timeout=timeout)[1])
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            raise
    return errs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """small.mlo, 30 steps, `--nproc 2` on one machine."""
    out = tmp_path_factory.mktemp("nproc2") / "run"
    ran = mloc("run", SMALL, "--nproc", 2, "--out", out, *QUIET)
    assert ran.returncode == 0, ran.stderr
    return out


def _no_scratch_left(tmp: Path) -> bool:
    return not any(p.name.startswith("mloc-") for p in tmp.iterdir())


@pytest.mark.slow
def test_two_machines_of_one_process_equal_nproc_2_bitwise(tmp_path, reference):
    out = tmp_path / "run"
    procs = machines(SMALL, 1, "--out", out, *QUIET, tmp=tmp_path)
    errs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], errs
    assert not any("waiting" in err for err in errs), errs     # said even under --quiet, when it is said
    assert same_state(out, reference)
    assert [r["step"] for r in records(out)] == [r["step"] for r in records(reference)]
    # node 1 wrote nothing in the run folder, and its scratch folder is gone
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    assert _no_scratch_left(tmp_path / "node1") and _no_scratch_left(tmp_path / "node0")
    assert '"nnodes": 2' in (out / "config.json").read_text()


def _all_dead(pids) -> bool:
    deadline = time.time() + 30
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def wait_for_step(run_dir: Path, step: int, procs, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while step_of(run_dir) < step:
        assert all(p.poll() is None for p in procs) and time.time() < deadline, "the run ended or hung early"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_machine_ends_the_run_with_one_report_and_it_resumes_bitwise(tmp_path):
    out = tmp_path / "run"
    node0, node1 = machines(FAULTY, 2, "--steps", 5000, "--out", out, *QUIET, *SLOW_LOSS, tmp=tmp_path)
    try:
        wait_for_step(out, 10, (node0, node1))
        workers = descendants(node0.pid) | descendants(node1.pid)
        assert len(workers) >= 4
        node1.kill()                                    # the launcher of machine 1, SIGKILL
        err0, _ = finish((node0, node1), timeout=180)
    finally:
        for p in (node0, node1):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert node0.returncode == 1, err0
    lines = err0.strip().splitlines()
    assert lines[0] == ("error: the run lost its ranks on another machine: this one (node 0, ranks 0-1 of 4) "
                        "stopped its workers"), err0
    assert len(lines) == 3 and sum(x.startswith("error") for x in lines) == 1, err0
    assert f"the last checkpoint is {out / 'checkpoint.pt'}: continue with `--resume {out}`" in lines[1]
    for noise in ("Traceback", "gloo", "Connection", "exited with code"):
        assert noise not in err0
    assert _all_dead(workers), "a worker outlived its machine's run"
    assert not (out / ".lock").exists()
    # both machines again, from node 0's folder: bitwise where one machine's --nproc 4 ends
    step = step_of(out)
    resumed = machines(FAULTY, 2, "--resume", out, "--steps", step + 5, *QUIET, tmp=tmp_path)
    errs = finish(resumed)
    assert [p.returncode for p in resumed] == [0, 0], errs
    ref = mloc("run", FAULTY, "--nproc", 4, "--steps", step + 5, "--out", tmp_path / "ref", *QUIET, *SLOW_LOSS)
    assert ref.returncode == 0, ref.stderr
    assert step_of(out) == step + 5 and same_state(out, tmp_path / "ref")


@pytest.mark.slow
def test_a_killed_node_0_ends_the_run_on_machine_1_with_one_report(tmp_path):
    out = tmp_path / "run"
    node0, node1 = machines(FAULTY, 1, "--steps", 5000, "--out", out, *QUIET, *SLOW_LOSS, tmp=tmp_path)
    try:
        wait_for_step(out, 10, (node0, node1))
        workers = descendants(node0.pid) | descendants(node1.pid)
        node0.kill()                                    # rank 0's machine: the rendezvous store goes with it
        _, err1 = finish((node0, node1), timeout=180)
    finally:
        for p in (node0, node1):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert node1.returncode == 1, err1
    lines = err1.strip().splitlines()
    assert lines[0] == ("error: the run lost its ranks on another machine: this one (node 1, rank 1 of 2) stopped "
                        "its workers") and len(lines) == 2, err1
    assert _all_dead(workers) and _no_scratch_left(tmp_path / "node1")
    # node 0's lock names a dead launcher: the run resumes there (here on one machine, to show the folder is free)
    assert mloc("run", FAULTY, "--nproc", 2, "--steps", step_of(out) + 2, "--resume", out, *QUIET).returncode == 0


@pytest.mark.slow
def test_machines_started_with_different_steps_are_refused_before_training(tmp_path):
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    procs = [start([sys.executable, "-m", "mloc", "run", SMALL, "--nnodes", 2, "--node-rank", rank, "--rdzv-endpoint",
                    endpoint, "--out", out, "--steps", steps, *QUIET], tmp_path / f"node{rank}")
             for rank, steps in ((0, 30), (1, 40))]
    errs = finish(procs)
    assert [p.returncode for p in procs] == [2, 2], errs
    for err in errs:
        lines = err.strip().splitlines()
        assert lines[0] == ("error: the ranks of this run were not started alike: --steps 30 on rank 0, 40 on rank 1"), err
        assert len(lines) == 2 and "only --node-rank differing" in lines[1], err
    assert not (out / "checkpoint.pt").exists() and _no_scratch_left(tmp_path / "node1")


@pytest.mark.slow
@pytest.mark.parametrize("machine", [0, 1])
def test_ctrl_c_on_either_machine_stops_the_run_with_a_checkpoint(tmp_path, machine):
    out = tmp_path / "run"
    procs = machines(FAULTY, 1, "--steps", 5000, "--out", out, *QUIET, *SLOW_LOSS, tmp=tmp_path)
    try:
        wait_for_step(out, 10, procs)
        os.killpg(procs[machine].pid, signal.SIGINT)        # what that machine's terminal's Ctrl-C does
        errs = finish(procs, timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [130, 130], errs
    step = step_of(out)
    assert step >= 10 and f"interrupted at step {step} of 5000: wrote {out / 'checkpoint.pt'}" in errs[0], errs
    assert errs[1].strip().splitlines()[-1].startswith("stopped: the run was interrupted"), errs
    assert not (out / ".lock").exists()


def _compiled(tmp_path: Path) -> Path:
    build = tmp_path / "build"
    ran = mloc("compile", SMALL, "-o", build)
    assert ran.returncode == 0, ran.stderr
    return build / "train.py"


@pytest.mark.slow
def test_an_error_in_a_rank_on_machine_1_is_reported_there_and_lost_on_machine_0(tmp_path):
    out = tmp_path / "run"
    procs = machines(FAULTY, 1, "--out", out, *QUIET,
                     "--set", "weights.loss=lib.ce_raising(net, batch, rank=1, after=12)", tmp=tmp_path)
    err0, err1 = finish(procs)
    assert [p.returncode for p in procs] == [1, 1], (err0, err1)
    first = err1.strip().splitlines()[0]
    assert first.startswith("error[E702]: the program's code raised ValueError") and "on rank 1 of 2" in first, err1
    assert err0.strip().splitlines()[0].startswith("error: the run lost its ranks on another machine"), err0
    for noise in ("Traceback", "gloo", "Connection"):
        assert noise not in err0 + err1
    assert step_of(out) == 10 and _no_scratch_left(tmp_path / "node1")


@pytest.mark.slow
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_train_py_under_a_two_machine_torchrun_equals_nproc_2(tmp_path, reference, rendezvous):
    train_py, port, out = _compiled(tmp_path), free_port(), tmp_path / "run"
    meet = (("--master-addr", "127.0.0.1", "--master-port", port) if rendezvous == "static" else
            ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t"))
    procs = [start([sys.executable, "-m", "torch.distributed.run", "--nnodes", 2, "--node-rank", rank,
                    "--nproc-per-node", 1, *meet, train_py, "--out", out, *QUIET], tmp_path / f"node{rank}")
             for rank in (0, 1)]
    errs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], errs
    assert same_state(out, reference)


@pytest.mark.slow
def test_train_py_under_srun_variables_equals_nproc_2(tmp_path, reference):
    train_py, port, out = _compiled(tmp_path), free_port(), tmp_path / "run"
    base = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank in (0, 1):                 # what srun --nodes 2 --ntasks-per-node 1 sets, and what the script exports
        env = {**base, "SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
               "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(train_py), "--out", str(out), *map(str, QUIET)], cwd=ROOT,
                                      env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      start_new_session=True))
    errs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], errs
    assert same_state(out, reference)
