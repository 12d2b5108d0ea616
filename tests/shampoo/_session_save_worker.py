"""One rank of tests/shampoo/test_session_save.py (started by ``run_workers`` under
torchrun's environment): ``mloc.load`` of the Shampoo program with asynchronous roots due
one step late, 5 steps, ``Session.save`` (every rank calls it; the calls of
``save_checkpoint`` are counted), 2 more steps; then the session restores the file
and takes the same 2 steps again. Prints, as its last line, JSON: how many files this rank wrote,
and whether the restored run's parameters and Shampoo state equal the uninterrupted one's
bit for bit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

import mloc
from mloc.runtime.program import checkpoint
from mloc.runtime.processes.ending import end_rank
from tests.shampoo.test_nproc_run import PROGRAM

SETS = ["net.optimizer.staleness=1", 'net.optimizer.root_method="newton"', "net.optimizer.async_roots=true",
        "net.data=lib.data(seed=0, batch_size=8)", "weights.data=lib.data(seed=10, batch_size=8)"]


def _state(session) -> list[torch.Tensor]:
    state = session.program.state_dict()
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(state["problems"])
    return out


def main() -> None:
    path = Path(os.environ["SAVE_OUT"]) / "session.pt"
    writes = []
    real = checkpoint.save_checkpoint
    checkpoint.save_checkpoint = lambda *a, **k: writes.append(a[0]) or real(*a, **k)
    first = mloc.load(PROGRAM, set=SETS, dtype="float64")
    first.run(5)
    first.save(path)
    first.run(2)
    a = _state(first)
    first.restore(path)         # the same session (a second process group in one process
    first.run(2)                # would race for the port): everything comes from the file
    b = _state(first)
    first.program.close()
    same = len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))
    print(json.dumps({"writes": len(writes), "same": same, "tensors": len(a)}))


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
