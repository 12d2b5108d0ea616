"""One rank of the sharded ``hypergradients()`` test (run by test_fsdp_hypergrad.py with
torchrun's variables; ``HG_METHOD``: the edge's method, ``HG_BATCH``: this rank's batch,
``HG_DTYPE``: float32 or float64).

``fsdp_hg.mlo`` loaded with ``strategy="fsdp"``: ``hypergradients()`` at the initial state
(no batch drawn yet: it draws them, as one process does), then after ``STEPS`` outer steps,
with a sentinel ``.grad`` on every sharded parameter. Prints one JSON line: both results
(whole tensors, as lists) and whether the second call left the training state (the gathered
``state_dict()``: parameters, optimizer states, buffers, data positions, RNGs), the batches
and every ``.grad`` exactly as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

import mloc
from mloc.runtime.processes.ending import end_rank

PROGRAM = Path(__file__).resolve().parent / "fsdp_hg.mlo"
STEPS = 2


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    return x == y


def listed(grads: dict) -> dict:
    return {up: {k: v.tolist() for k, v in g.items()} for up, g in grads.items()}


def main() -> None:
    batch = int(os.environ["HG_BATCH"])
    sets = [f"weights->net.hypergrad={os.environ['HG_METHOD']}",
            f"net.data=lib.data(seed=0, batch_size={batch})", f"weights.data=lib.data(seed=10, batch_size={batch})"]
    session = mloc.load(PROGRAM, set=sets, strategy="fsdp", dtype=os.environ["HG_DTYPE"])
    program = session.program
    try:
        assert program.fsdp is not None, program.strategy
        first = session.hypergradients()
        session.run(STEPS)
        shards = [p for lv in program.live.values() for p in lv.shards]
        for i, p in enumerate(shards):
            p.grad = torch.full_like(p, float(i + 1))
        grads_before = [p.grad for p in shards]
        sentinels = [p.grad.to_local().clone() for p in shards]
        batches = {n: lv.batch for n, lv in program.live.items()}
        before = program.state_dict()
        second = session.hypergradients()
        after = program.state_dict()
        untouched = {
            "state": same(before, after),
            "batches": all(lv.batch is batches[n] for n, lv in program.live.items()),
            "grad": all(p.grad is g and torch.equal(p.grad.to_local(), s)
                        for p, g, s in zip(shards, grads_before, sentinels)),
        }
    finally:
        session.program.close()
    print(json.dumps({"initial": listed(first), "after": listed(second), "untouched": untouched}))


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
