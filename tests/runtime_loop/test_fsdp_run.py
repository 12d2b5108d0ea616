"""`mloc run --strategy fsdp` (slow tier): two gloo processes, both modules sharded
(:mod:`mloc.runtime.program.fsdp_run`), each with batch B, equal one process with batch 2B
within 1e-5 relative (float32) for plain steps and for every method whose registry caps
say ``shards`` (a new such method is covered here automatically); checkpoints are whole
tensors (a ddp run's, within 1e-5), so a run stopped and resumed under fsdp equals the
uninterrupted one bitwise and a fsdp checkpoint resumes under ddp (each parameter gathered
and stored once, for ``params`` and ``module`` both); ``config.json``'s ``param_bytes``
(rank 0's) is about 1/N of one process's at N = 1, 2, 4.

The data are read in order (``shuffle=false``): two ranks with batch B then see, at each
step, exactly the 2B examples of one process's batch (:mod:`mloc.runtime.program.data`), so
the only difference is the order of float32 sums (the reduce-scatter's average against one
batch mean): measured <= 6e-7 relative after 6 steps."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mloc.builtins import METHODS
from tests.conftest import PROGRAMS
from tests.run.helpers import SMALL, mloc, params, same_state

SHARDS = sorted(n for n, d in METHODS.items() if d.caps.shards)
PLAIN = """program plain
import small as lib
problem net {
    module    = lib.Net(width=8)
    data      = lib.data(seed=0, batch_size=16, shuffle=false)
    loss      = lib.ce(net, batch)
    optimizer = adam(lr=0.01)
}
train { steps = 6  seed = 0  device = cpu  checkpoint every 5  log every 5 }
"""


def _data(batch: int) -> list[str]:
    return ["--set", f"net.data=lib.data(seed=0, batch_size={batch}, shuffle=false)",
            "--set", f"weights.data=lib.data(seed=10, batch_size={batch}, shuffle=false)"]


def _run(program, out, *args) -> None:
    proc = mloc("run", program, "--quiet", "--compile", "off", "--threads", "1", "--out", out, *map(str, args))
    assert proc.returncode == 0, proc.stderr[-3000:]


def _close(a, b, tol: float = 1e-5) -> float:
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    errs = {k: float((pa[k] - pb[k]).abs().max() / pb[k].abs().max().clamp_min(1e-12)) for k in pb}
    assert max(errs.values()) <= tol, errs
    return max(errs.values())


def test_some_method_shards():
    assert SHARDS, "no method in the registry says `shards`: the equality cases below would be empty"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["plain"] + SHARDS)
def test_two_sharded_processes_with_batch_b_equal_one_process_with_2b(tmp_path, case):
    if case == "plain":           # plain steps alone: one problem
        shutil.copy(SMALL.parent / "small.py", tmp_path / "small.py")
        program, sets = tmp_path / "plain.mlo", []
        program.write_text(PLAIN)
        one = ["--set", "net.data=lib.data(seed=0, batch_size=16, shuffle=false)"]
        two = ["--set", "net.data=lib.data(seed=0, batch_size=8, shuffle=false)"]
    else:
        program, sets, one, two = SMALL, ["--set", f"weights->net.hypergrad={case}"], _data(16), _data(8)
    _run(program, tmp_path / "fsdp", "--steps", 6, "--nproc", 2, "--strategy", "fsdp", *sets, *two)
    _run(program, tmp_path / "one", "--steps", 6, *sets, *one)
    assert json.loads((tmp_path / "fsdp" / "config.json").read_text())["run"]["strategy"] == "fsdp"
    _close(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
def test_fsdp_checkpoints_are_whole_and_resume_bitwise_and_into_ddp(tmp_path):
    sama = ["--set", "weights->net.hypergrad=sama"]
    fsdp = ["--nproc", 2, "--strategy", "fsdp", *sama, *_data(8)]
    _run(SMALL, tmp_path / "whole", "--steps", 10, *fsdp)
    _run(SMALL, tmp_path / "again", "--steps", 5, *fsdp)
    shutil.copytree(tmp_path / "again", tmp_path / "again5")
    _run(SMALL, tmp_path / "again", "--steps", 10, "--resume", tmp_path / "again", *fsdp)
    assert same_state(tmp_path / "again", tmp_path / "whole")
    _run(SMALL, tmp_path / "ddp", "--steps", 5, *fsdp)
    _run(SMALL, tmp_path / "ddp", "--steps", 10, "--resume", tmp_path / "ddp", "--nproc", 2, "--strategy", "ddp",
         *sama, *_data(8))
    _close(tmp_path / "ddp", tmp_path / "whole")
    _run(SMALL, tmp_path / "ddp5", "--steps", 5, "--nproc", 2, "--strategy", "ddp", *sama, *_data(8))
    _close(tmp_path / "again5", tmp_path / "ddp5")     # gathered: the tensors a ddp run writes
    _each_parameter_once(tmp_path / "again5" / "checkpoint.pt")


def _each_parameter_once(path) -> None:
    """Every problem's ``params`` are its ``module`` entries' gathered copies (one storage each)."""
    from mloc.runtime.program.checkpoint import load_checkpoint
    for name, saved in load_checkpoint(path, None)["problems"].items():
        module = {v.untyped_storage().data_ptr() for v in saved["module"].values()}
        assert saved["params"] and all(p.untyped_storage().data_ptr() in module for p in saved["params"]), name


@pytest.mark.slow
def test_per_rank_parameter_bytes_are_about_one_nth(tmp_path):
    """data_reweighting.mlo's 64-256-10 classifier and 1-100-1 weight net: rank 0 holds
    ``⌈rows/N⌉`` rows of each parameter, so a layer with fewer rows than ranks (the 10-
    and 1-row outputs) keeps rank 0 a little over 1/N."""
    got = {}
    for n in (1, 2, 4):
        out = tmp_path / f"n{n}"
        _run(PROGRAMS / "data_reweighting.mlo", out, "--steps", 1, "--nproc", n, "--strategy", "fsdp")
        got[n] = json.loads((out / "config.json").read_text())["run"]["param_bytes"]
    whole = (64 * 256 + 256 + 256 * 10 + 10 + 100 + 100 + 100 + 1) * torch.float32.itemsize
    assert got[1] == whole
    for n in (2, 4):
        assert 1 / n <= got[n] / whole <= 1 / n + 0.02, (n, got[n] / whole)
