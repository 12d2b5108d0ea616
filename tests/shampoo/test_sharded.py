"""Data parallelism: with a process group of 2 (gloo), each rank computes half of every
batch of roots and all-gathers; the trained parameters and roots equal one process's
bit for bit (each matrix's Newton iteration and λmax are frozen per matrix, so a root
does not depend on which matrices share its batch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mloc.runtime.processes.workers import free_port
from tests.conftest import ROOT
from tests.shampoo._sharded_worker import initial, train


@pytest.mark.slow      # two interpreter starts: 17 s on 2 busy cores
def test_two_gloo_ranks_with_sharded_roots_equal_one_process(tmp_path):
    out, port = tmp_path / "rank0.pt", str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.shampoo._sharded_worker", str(r), "2", port,
                               str(out)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    got = torch.load(out)
    params = initial()
    _, state = train(params)
    assert all(torch.equal(a, b) for a, b in zip(params, got["params"]))
    roots = [r for rs in state.roots for r in rs]
    assert len(roots) > 4 and all(torch.equal(a, b) for a, b in
                                  zip(roots, [r for rs in got["roots"] for r in rs]))
