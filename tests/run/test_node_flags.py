"""Multi-node launch without processes (issue 26): the node flags' checks (exit 2, with what
to pass instead), the ranks each machine's workers get, the torchrun commands mloc prints,
and the launch variables `train.py` understands (torchrun's, SLURM srun's). The runs on
two "machines" on loopback are in `test_nodes.py` (slow tier)."""

from __future__ import annotations

import pytest

from mloc.runtime.base.distributed import DistContext, LaunchError, launch_env
from mloc.runtime.processes.nodes import Nodes, lost_peers, torchrun_commands
from tests.run.helpers import SMALL

BAD = [
    (("--nnodes", 2, "--rdzv-endpoint", "h:1"), "--nnodes 2 needs --node-rank", "--node-rank 0 on the machine"),
    (("--nnodes", 2, "--node-rank", 2, "--rdzv-endpoint", "h:1"), "--node-rank must be between 0 and 1",
     "0 on the machine that holds the run folder"),
    (("--nnodes", 2, "--node-rank", -1, "--rdzv-endpoint", "h:1"), "--node-rank must be between 0 and 1", None),
    (("--nnodes", 2, "--node-rank", 0), "--nnodes 2 needs --rdzv-endpoint HOST:PORT", "the same HOST:PORT"),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", "h"), "--rdzv-endpoint must be HOST:PORT", "node0:29500"),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", "h:0"), "a port from 1 to 65535, got 'h:0'", None),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", ":29500"), "--rdzv-endpoint must be HOST:PORT", None),
    (("--nnodes", 0), "--nnodes must be at least 1, got 0", None),
    (("--node-rank", 1), "--node-rank only applies to a run on several machines", "add --nnodes M"),
    (("--nnodes", 1, "--node-rank", 1), "--node-rank must be between 0 and 0", None),
    (("--nnodes", 1, "--print-torchrun"), "--nnodes 1 needs --rdzv-endpoint HOST:PORT", None),
    (("--rdzv-endpoint", "h:1"), "--rdzv-endpoint only applies to a run on several machines", None),
    (("--rdzv-timeout", 30), "--rdzv-timeout only applies to a run on several machines", "add --nnodes M"),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", "h:1", "--rdzv-timeout", 0),
     "--rdzv-timeout must be a number of seconds above 0, got 0", "--rdzv-timeout 1800"),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", "h:1", "--rdzv-timeout", "nan"),
     "--rdzv-timeout must be a number of seconds above 0, got nan", None),
    (("--print-torchrun",), "--print-torchrun only applies to a run on several machines", None),
    (("--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", "h:1", "--pipeline"), "--pipeline runs on one machine",
     None),
]


@pytest.mark.parametrize("flags,message,help", BAD, ids=[" ".join(map(str, b[0])) for b in BAD])
def test_a_bad_node_flag_is_a_usage_error_that_says_what_to_pass(mloc_here, tmp_path, flags, message, help):
    ran = mloc_here("run", SMALL, *flags, "--out", tmp_path / "run")
    assert ran.returncode == 2, ran.stderr
    first = ran.stderr.splitlines()[0]
    assert first.startswith("error") and message in first, ran.stderr
    if help is not None:
        assert "help:" in ran.stderr and help in ran.stderr, ran.stderr
    assert not (tmp_path / "run").exists()         # refused before anything is written


def test_nnodes_1_takes_node_rank_0_and_runs_on_this_machine_alone():
    import argparse

    from mloc.runtime.files.options import RunOptions, add_flags, add_launch_flags
    p = argparse.ArgumentParser()
    add_flags(p)
    add_launch_flags(p)
    options = RunOptions.parsed(p.parse_args(["--nnodes", "1", "--node-rank", "0", "--rdzv-endpoint", "h:1"]))
    assert not options.multinode and options.node_rank == 0
    assert RunOptions.parsed(p.parse_args(["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"])).multinode


def test_ranks_are_numbered_node_by_node_as_torchrun_numbers_them():
    node = Nodes(nnodes=3, node_rank=1, nproc=2, endpoint="10.0.0.1:29500")
    assert node.world == 6 and list(node.ranks) == [2, 3]
    env = node.env(1)
    assert env == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                   "GROUP_WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert node.names() == ["rank 2 of 6 (node 1)", "rank 3 of 6 (node 1)"]
    assert Nodes(2, 0, 1, "[::1]:7").env(0)["MASTER_ADDR"] == "::1"


def test_the_printed_torchrun_commands_use_the_same_rendezvous():
    lines = torchrun_commands(Nodes(2, 0, 2, "node0:29500"), "build/train.py", ["--out", "runs/a b"])
    assert lines == [f"torchrun --nnodes 2 --node-rank {r} --nproc-per-node 2 --master-addr node0 --master-port 29500 "
                     "build/train.py --out 'runs/a b'" for r in (0, 1)]


def test_print_torchrun_prints_a_command_per_machine_and_writes_nothing(mloc_here, tmp_path):
    ran = mloc_here("run", SMALL, "--nnodes", 2, "--nproc", 2, "--rdzv-endpoint", "127.0.0.1:29500",
                    "--print-torchrun", "--out", tmp_path / "run", "--set", "net.optimizer.lr=0.05")
    assert ran.returncode == 0, ran.stderr
    commands = [x for x in ran.stdout.splitlines() if not x.startswith("#")]
    assert commands[0] == f"mloc compile {SMALL} -o build --set net.optimizer.lr=0.05"
    assert [c.split()[4] for c in commands[1:]] == ["0", "1"]
    assert all(f"build/train.py --out {tmp_path / 'run'}" in c for c in commands[1:])
    assert not (tmp_path / "run").exists()


def test_a_machine_that_lost_its_peers_says_so_once(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    text = lost_peers(Nodes(2, 0, 2, "h:1"), tmp_path)
    assert text.splitlines()[0] == ("error: the run lost its ranks on another machine: this one (node 0, ranks 0-1 "
                                    "of 4) stopped its workers")
    assert f"continue with `--resume {tmp_path}` on every machine" in text
    assert "no checkpoint" in lost_peers(Nodes(2, 1, 1, "h:1"), tmp_path / "none")
    assert "note" not in lost_peers(Nodes(2, 1, 1, "h:1"), None)


TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"}
SRUN = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"}


@pytest.mark.parametrize("env,expected", [
    ({}, {}),
    (TORCHRUN, TORCHRUN),
    ({**TORCHRUN, "PATH": "/bin"}, TORCHRUN),
    (SRUN, {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"}),
    ({**SRUN, "SLURM_NTASKS_PER_NODE": "2"},
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "5"}),
    ({**SRUN, **TORCHRUN, "RANK": "0"}, {**TORCHRUN, "RANK": "0"}),     # torchrun under srun: torchrun's own
    # a batch script's own environment: the allocation's task count, but no srun step: one process
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "MASTER_ADDR": "h", "MASTER_PORT": "5"},
     {"MASTER_ADDR": "h", "MASTER_PORT": "5"}),
], ids=["none", "torchrun", "torchrun-extra", "srun", "srun-per-node", "torchrun-under-srun", "sbatch-script"])
def test_launch_variables_come_from_torchrun_or_a_srun_step(env, expected):
    assert launch_env(env) == expected


def test_threads_are_divided_among_the_processes_of_this_machine_only(monkeypatch):
    from mloc.runtime.base.distributed import local_processes
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert local_processes(8) == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert local_processes(8) == 8


def test_a_srun_step_without_master_address_says_what_to_export(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in SRUN.items():
        if not key.startswith("MASTER"):
            monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError) as err:
        DistContext.from_env()
    assert "MASTER_ADDR, MASTER_PORT is not set" in str(err.value)
    assert "scontrol show hostnames $SLURM_JOB_NODELIST" in err.value.help


@pytest.mark.parametrize("key, value, says, fix", [
    ("RANK", "zero", "RANK='zero' is not an integer", "launch with torchrun"),
    ("MASTER_PORT", "29500x", "MASTER_PORT='29500x' is not an integer", "launch with torchrun"),
    ("WORLD_SIZE", "two", "WORLD_SIZE='two' is not an integer", "launch with torchrun"),
    ("MLOC_RDZV_TIMEOUT", "abc", "MLOC_RDZV_TIMEOUT='abc' is not a number", "MLOC_RDZV_TIMEOUT to the seconds"),
    ("MLOC_RDZV_TIMEOUT", "0", "MLOC_RDZV_TIMEOUT='0' is not a number of seconds above 0", "or unset it"),
])
def test_a_malformed_launch_variable_is_a_launch_error_naming_it(monkeypatch, key, value, says, fix):
    """Was a ValueError, reported as a bug in mloc (exit 101); a LaunchError is exit 2."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError) as err:
        DistContext.from_env()
    assert says in str(err.value) and fix in err.value.help
