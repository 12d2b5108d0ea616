"""Start ``n`` processes of a worker module as one gloo job on 127.0.0.1 (torchrun's
variables, no GPU), and read the JSON each prints on its last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mloc.runtime.processes.workers import free_port
from tests.conftest import ROOT


def run_workers(module: str, n: int, timeout: float, **env) -> list[dict]:
    """Rank r's last stdout line, parsed, for r = 0..n-1; each must exit 0 (its stderr's end
    is the assertion's message). ``env`` is added to every worker's environment."""
    port, procs = free_port(), []
    for rank in range(n):
        variables = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "", **env}
        procs.append(subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=variables,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results
