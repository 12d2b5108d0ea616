"""A machine of `mloc run --nnodes` whose workers wait for machines that never come: what
its launcher says while they wait (after 15 s, then rarely, and nothing when they join
promptly), `--rdzv-timeout`, and the one report per machine when it passes (exit 2, an
environment problem: no traceback, no worker left, nothing trained). The waiting and the
reports are checked here on a fake clock and written files; the launchers that really
wait are started with a timeout of 3 s on a free loopback port. That a normal two-machine
run says nothing is checked with the runs of `test_nodes.py` (slow tier)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from mloc.runtime.processes.joining import Joining, late, report, waiting
from mloc.runtime.processes.nodes import Nodes, mloc_commands
from mloc.runtime.processes.workers import EXIT_PEER, free_port
from tests.conftest import ROOT
from tests.run.helpers import ENV, SMALL, default_signals

RERUN = ("mloc", "run", "prog.mlo", "--out", "runs/a")
NODE0 = Nodes(2, 0, 2, "node0:29500", 600.0, RERUN)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _joining(tmp_path, nodes=NODE0) -> tuple[Joining, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    return Joining(nodes, tmp_path, mloc_commands(nodes), clock=clock, out=out), clock, out


def _at(joining: Joining, clock: Clock, seconds: float):
    clock.now = 100.0 + seconds
    return joining.tick()


def test_each_machine_is_shown_the_same_command_with_its_own_node_rank():
    assert mloc_commands(NODE0) == [f"mloc run prog.mlo --out runs/a --nnodes 2 --node-rank {r} --nproc 2 "
                                    "--rdzv-endpoint node0:29500" for r in (0, 1)]
    assert mloc_commands(Nodes(2, 1, 1, "h:1", 30.0, ("mloc", "run", "a b.mlo")))[0] == (
        "mloc run 'a b.mlo' --nnodes 2 --node-rank 0 --nproc 1 --rdzv-endpoint h:1 --rdzv-timeout 30")
    assert mloc_commands(Nodes(2, 0, 1, "h:1")) == []        # not started by `mloc run`: said in words


def test_a_machine_that_waits_says_so_after_15_s_then_rarely(tmp_path):
    joining, clock, out = _joining(tmp_path)
    assert _at(joining, clock, 0) is None and out.getvalue() == ""       # the workers are still starting
    (tmp_path / "rank0.join").write_text("joining\n")
    _at(joining, clock, 5)                              # the wait is counted from here
    for s in (6, 10, 19.8):
        assert _at(joining, clock, s) is None
    assert out.getvalue() == ""
    _at(joining, clock, 20.1)                         # (read at most every 0.25 s)
    said = out.getvalue()
    assert said == waiting(NODE0, 15.1, mloc_commands(NODE0)) + "\n"
    assert said.splitlines()[0] == ("waiting for the other machines to join the run at node0:29500: 15 s so far, of "
                                    "the --rdzv-timeout 600 s (this is node 0; the run has 2 machines of 2 "
                                    "processes each, 4 in all)")
    assert "node 1: mloc run prog.mlo --out runs/a --nnodes 2 --node-rank 1 --nproc 2" in said
    for s in range(21, 600, 1):                         # a reminder at 60 s and at 360 s, nothing else
        _at(joining, clock, s + 5)
    lines = out.getvalue()[len(said):].splitlines()
    assert lines == ["still waiting for the other machines to join the run at node0:29500: 60 s so far, of the "
                     "--rdzv-timeout 600 s",
                     "still waiting for the other machines to join the run at node0:29500: 360 s so far, of the "
                     "--rdzv-timeout 600 s"]


def test_a_machine_whose_workers_joined_says_nothing_and_stops_reading(tmp_path):
    joining, clock, out = _joining(tmp_path)
    (tmp_path / "rank1.join").write_text("joining\n")
    _at(joining, clock, 1)
    (tmp_path / "rank1.join").write_text("joined\n")
    _at(joining, clock, 2)
    (tmp_path / "rank1.join").write_text("failed\nlater")     # not read any more
    for s in range(3, 2000, 7):
        assert _at(joining, clock, s) is None
    assert out.getvalue() == "" and joining.failure() is None and not joining.overdue()


def test_workers_that_do_not_give_up_in_time_are_stopped(tmp_path):
    joining, clock, _ = _joining(tmp_path, Nodes(2, 1, 1, "h:7", 10.0))
    (tmp_path / "rank0.join").write_text("joining\n")
    _at(joining, clock, 0)
    assert late(10.0) == 13.0 and late(600.0) == 660.0 and late(1e5) == 1e5 + 60
    assert _at(joining, clock, 12.5) is None
    assert _at(joining, clock, 13.1) == EXIT_PEER
    assert joining.failure().startswith("error: this machine (node 1, rank 1 of 2) could not join the run at h:7 "
                                        "within --rdzv-timeout 10 s")


def test_the_report_takes_the_count_from_rank_0s_message(tmp_path):
    joining, _, _ = _joining(tmp_path)
    (tmp_path / "rank0.join").write_text("failed\nTimed out after 601 seconds waiting for clients. 3/4 clients "
                                         "joined.")
    (tmp_path / "rank1.join").write_text("failed\nConnection reset by peer")
    text = joining.failure()
    assert text.splitlines()[0] == ("error: the other machines did not join the run at node0:29500 within "
                                    "--rdzv-timeout 600 s: 3 of 4 processes joined; this machine (node 0, ranks "
                                    "0-1 of 4) stopped its workers; nothing was trained")
    assert sum(x.startswith("error") for x in text.splitlines()) == 1
    assert "node 1: mloc run prog.mlo" in text and "port 29500 free there" in text
    assert "--rdzv-timeout SECONDS to wait longer" in text


@pytest.mark.parametrize("said,first,also", [
    ("The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, "
     "name: EADDRINUSE, message: address already in use",
     "error: the run cannot meet at node0:29500: port 29500 is in use on this machine", "a port that is free"),
    ("The client socket has timed out after 600000ms while trying to connect to (node0, 29500).",
     "error: this machine (node 0, ranks 0-1 of 4) could not join the run at node0:29500 within", "node 1:"),
    ("Connection reset by peer", "error: the run's processes did not all join at node0:29500: the rendezvous failed "
     "(Connection reset by peer)", "another machine may have failed"),
], ids=["port-in-use", "unreachable", "closed"])
def test_each_way_joining_fails_has_its_report(said, first, also):
    text = report(NODE0, said, mloc_commands(NODE0))
    assert text.startswith(first) and also in text, text
    assert "Traceback" not in text and "c10d" not in text


def test_without_the_commands_the_report_says_what_to_run_in_words():
    text = report(Nodes(2, 1, 1, "h:7"), "no answer within 600 s", [])
    assert "each machine runs the same `mloc run` command with its own --node-rank (0 .. 1) and --rdzv-endpoint h:7" \
        in text


def test_the_join_timeout_governs_joining_and_collectives_keep_theirs(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from mloc.runtime.base.distributed import DistContext, Join, JoinError
    assert not dist.is_initialized()
    port = free_port()
    with pytest.raises(JoinError) as err:           # rank 0 of 2 alone: torch says how many joined
        DistContext.connect(0, 2, "127.0.0.1", port, join=Join(1.0), device=torch.device("cpu"))
    assert "rank 0 of 2 could not join the others at 127.0.0.1" in str(err.value)
    assert "1/2 clients joined" in str(err.value) and "MASTER_PORT" in err.value.help
    said = tmp_path / "rank0.join"                  # under a launcher that watches: torch's error, and the file says
    with pytest.raises(dist.DistError):
        DistContext.connect(0, 2, "127.0.0.1", free_port(), join=Join(1.0, str(said)), device=torch.device("cpu"))
    assert said.read_text().startswith("failed\nTimed out after") and not dist.is_initialized()
    try:
        DistContext.connect(0, 1, "127.0.0.1", free_port(), timeout_s=600.0, join=Join(5.0, str(said)),
                            device=torch.device("cpu"))
        assert said.read_text() == "joined\n"
        backend = c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=600)
        assert c10d._get_default_store().timeout == timedelta(seconds=600)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _ours(marker: str) -> list[int]:
    """The live processes whose command line names ``marker`` (a test's folder)."""
    pids = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmd.read_bytes().decode(errors="replace"):
                pids.append(int(cmd.parent.name))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


def test_a_machine_alone_gives_up_after_rdzv_timeout_with_one_report(tmp_path):
    """Node 0 of two (two workers) and node 1 of another run, each alone, at once."""
    out, ports = tmp_path / "run", (free_port(), free_port())
    procs = []
    for rank, nproc in ((0, 2), (1, 1)):
        (tmp_path / f"tmp{rank}").mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "mloc", "run", str(SMALL), "--nnodes", "2", "--node-rank", str(rank), "--nproc",
             str(nproc), "--rdzv-endpoint", f"127.0.0.1:{ports[rank]}", "--rdzv-timeout", "3", "--out", str(out),
             "--threads", "1", "--compile", "off", "--quiet"], cwd=ROOT,
            env={**ENV, "TMPDIR": str(tmp_path / f"tmp{rank}")}, text=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True))
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]      # a hang guard, not a measurement
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [2, 2], errs
    reports = [err.strip().splitlines() for err in errs]
    assert reports[0][0] == (f"error: the other machines did not join the run at 127.0.0.1:{ports[0]} within "
                             "--rdzv-timeout 3 s: 2 of 4 processes joined; this machine (node 0, ranks 0-1 of 4) "
                             "stopped its workers; nothing was trained"), errs[0]
    assert reports[1][0] == (f"error: this machine (node 1, rank 1 of 2) could not join the run at 127.0.0.1:"
                             f"{ports[1]} within --rdzv-timeout 3 s; it stopped its workers; nothing was trained"), \
        errs[1]
    for lines in reports:
        assert sum(x.startswith("error") for x in lines) == 1, lines
        assert any(x.strip().startswith("node 1: mloc run ") and "--node-rank 1" in x for x in lines), lines
        for noise in ("Traceback", "c10d", "TCPStore", "exited with code", "lost its ranks"):
            assert noise not in "\n".join(lines)
    deadline = time.monotonic() + 30
    while _ours(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ours(str(tmp_path)), "a worker outlived its launcher"
    assert not (out / "checkpoint.pt").exists() and not (out / ".lock").exists()
    assert not [p for d in ("tmp0", "tmp1") for p in (tmp_path / d).iterdir() if p.name.startswith("mloc-")]


@pytest.mark.slow
def test_a_waiting_machine_says_so_and_ctrl_c_ends_the_wait_at_once(tmp_path):
    """Node 0 alone with the default timeout: the note after 15 s, live; then Ctrl-C."""
    out, port = tmp_path / "run", free_port()
    p = subprocess.Popen([sys.executable, "-m", "mloc", "run", str(SMALL), "--nnodes", "2", "--node-rank", "0",
                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--out", str(out), "--threads", "1", "--compile",
                          "off", "--quiet"], cwd=ROOT, env={**ENV, "TMPDIR": str(tmp_path)}, text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=default_signals)
    try:
        said = [p.stderr.readline()]            # blocks until the launcher says something
        while not said[-1].startswith("  = help:"):
            said.append(p.stderr.readline())
        first = said[0]
        assert first.startswith(f"waiting for the other machines to join the run at 127.0.0.1:{port}: 15 s so far, "
                                "of the --rdzv-timeout 600 s (this is node 0; the run has 2 machines of 1 process "
                                "each, 2 in all)"), first
        os.killpg(p.pid, signal.SIGINT)         # what the terminal's Ctrl-C does
        rest = p.communicate(timeout=60)[1]    # before the fix it waited out the 600 s timeout
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, rest
    assert any(x.strip().startswith("node 1: mloc run") and "--node-rank 1" in x for x in said), said
    assert rest.strip().splitlines()[-1] == (f"interrupted while waiting for the other machines to join the run at "
                                             f"127.0.0.1:{port}: stopping this machine's workers; nothing was trained")
    assert "Traceback" not in rest and "stopping at the next log step" not in rest
    deadline = time.monotonic() + 30
    while _ours(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ours(str(tmp_path)) and not (out / ".lock").exists()
