"""DistContext: a real 2-process gloo run on 127.0.0.1, the single-process no-ops, and the
device and backend of each data-parallel process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mloc.runtime.program.build import resolve_device
from mloc.runtime.base.distributed import DistContext, backend_for
from mloc.runtime.base.precision import DeviceError
from tests.conftest import ROOT
from tests.runtime_loop._gloo import run_workers


def test_two_gloo_processes():
    results = run_workers("tests.runtime_loop._dist_worker", 2, timeout=90)
    for rank, r in enumerate(results):
        assert (r["rank"], r["world"], r["backend"], r["is_main"]) == (rank, 2, "gloo", rank == 0)
        assert r["broadcast"] == [[1.0] * 3, [10.0] * 4]
        assert r["allreduce"] == [[0.0, 1.5, 3.0, 4.5], [3.0] * 6, 1]    # one collective
        assert r["dp_error"] < 1e-12
        assert r["again"] == [rank, 2, True, [5.0, 5.0]]


def test_single_process_context_is_a_no_op():
    ctx = DistContext()
    assert (ctx.rank, ctx.world, ctx.is_main, ctx.backend) == (0, 1, True, None)
    p = torch.ones(2, requires_grad=True)
    p.grad = torch.full((2,), 3.0)
    ctx.allreduce_grads((p,))
    ctx.broadcast_params((p,))
    ctx.barrier()
    assert p.grad.tolist() == [3.0, 3.0]


def _cuda_machine(monkeypatch, count: int) -> None:
    """Pretend this machine has ``count`` CUDA devices (only the counting is faked: no test
    here creates a CUDA tensor)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("count,name,world,want", [
    (1, "auto", 1, "cuda:0"), (1, "auto", 2, "cpu"), (2, "auto", 2, "cuda:1"), (0, "auto", 2, "cpu"),
    (2, "cuda", 2, "cuda:1"), (1, "cpu", 2, "cpu"), (4, "cuda:2", 1, "cuda:2"),
])
def test_every_data_parallel_process_gets_a_device_of_its_own(monkeypatch, count, name, world, want):
    """The last rank's device (``local_rank = world - 1``) and its backend: nccl on CUDA,
    gloo on the CPU, also on a machine that has GPUs (``--device cpu``)."""
    _cuda_machine(monkeypatch, count)
    device = resolve_device(name, world - 1, world)
    assert str(device) == want
    assert backend_for(device) == ("nccl" if want.startswith("cuda") else "gloo")


@pytest.mark.parametrize("count,name,world,says,fix", [
    (1, "cuda", 2, "--nproc 2 on CUDA needs 2 devices, one per process; this machine has 1 CUDA device",
     "use --nproc 1, or --device cpu (gloo)"),
    (3, "cuda", 4, "this machine has 3 CUDA devices", "use --nproc 3 or fewer, or --device cpu (gloo)"),
    (0, "cuda", 2, "this machine has no CUDA device", "use --device cpu (gloo)"),
    (2, "cuda:0", 2, "--device cuda:0 names one GPU for all 2 processes", "use --device cuda (cuda:0 … cuda:1)"),
])
def test_too_few_gpus_for_the_processes_is_a_device_error(monkeypatch, count, name, world, says, fix):
    """Not a CUDA error deep inside a worker (nccl cannot put two ranks on one GPU, and
    ``cuda:1`` does not exist on a one-GPU machine): what is missing and what to pass."""
    _cuda_machine(monkeypatch, count)
    with pytest.raises(DeviceError) as e:
        resolve_device(name, 0, world)
    assert says in str(e.value) and e.value.help.startswith(fix)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nproc_on_cuda_without_gpus_fails_before_any_worker_or_folder(tmp_path):
    """``mloc run --nproc 2 --device cuda`` here: exit 2 with the device error, checked
    before the run folder is made or a worker is started."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(ROOT / "programs" / "hpo.mlo"), "--nproc", "2",
                           "--device", "cuda", "--steps", "2", "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--nproc 2 on CUDA needs 2 devices" in proc.stderr and "help: use --device cpu" in proc.stderr
    assert not out.exists() and "Traceback" not in proc.stderr


def test_programs_built_one_after_another_under_torchrun_share_the_process_group():
    """``mloc.load`` three times in one process of a 2-process launch (the API in a script
    under torchrun): each session, closed or not, uses the group the first joined. A second
    ``init_process_group`` on the launch's port used to fail ("trying to initialize the
    default process group twice", and after the first left it, gloo's "Connection refused")."""
    results = run_workers("tests.runtime_loop._sessions_worker", 2, timeout=120)
    for rank, r in enumerate(results):
        assert r["rank"] == rank
        first, *later = r["steps"]
        assert all(s == first for s in later)           # same seed, same data: the same step
    assert results[0]["steps"] == results[1]["steps"]   # the replicas agree
