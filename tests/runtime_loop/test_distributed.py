"""DistContext: a real 2-process gloo run on 127.0.0.1, and the single-process no-ops."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import torch

from mloc.runtime.distributed import DistContext
from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes():
    port, procs = free_port(), []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": ""}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.runtime_loop._dist_worker"], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, r in enumerate(results):
        assert (r["rank"], r["world"], r["backend"], r["is_main"]) == (rank, 2, "gloo", rank == 0)
        assert r["broadcast"] == [[1.0] * 3, [10.0] * 4]
        assert r["allreduce"] == [[0.0, 1.5, 3.0, 4.5], [3.0] * 6, 1]    # one collective
        assert r["dp_error"] < 1e-12
        assert r["closed"]


def test_single_process_context_is_a_no_op():
    ctx = DistContext()
    assert (ctx.rank, ctx.world, ctx.is_main, ctx.backend) == (0, 1, True, None)
    p = torch.ones(2, requires_grad=True)
    p.grad = torch.full((2,), 3.0)
    ctx.allreduce_grads((p,))
    ctx.broadcast_params((p,))
    ctx.barrier()
    ctx.close()
    assert p.grad.tolist() == [3.0, 3.0]
