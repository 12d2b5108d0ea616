"""One rank of the 2-process gloo test (run by test_distributed.py with torchrun's variables).

Prints one JSON line: what this rank observed."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from mloc.runtime.program.data import DataStream, distributed_loader
from mloc.runtime.base.distributed import DistContext
from mloc.runtime.processes.ending import end_rank


def loader(batch_size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g, dtype=torch.float64)
    y = torch.randn(64, generator=g, dtype=torch.float64)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(1))


def loss(w, batch):
    x, y = batch
    return ((x @ w - y) ** 2).mean()


def main():
    ctx = DistContext.from_env(timeout_s=60)
    out = {"rank": ctx.rank, "world": ctx.world, "backend": ctx.backend, "is_main": ctx.is_main}
    # broadcast: rank 0's values win, for two dtypes
    a, b = torch.full((3,), float(ctx.rank + 1)), torch.full((2, 2), ctx.rank + 10.0, dtype=torch.float64)
    ctx.broadcast_params((a, b))
    out["broadcast"] = [a.tolist(), b.reshape(-1).tolist()]
    # allreduce: one collective, the mean of the ranks' gradients; a missing grad is zeros
    calls, real = [], dist.all_reduce
    dist.all_reduce = lambda *args, **kw: (calls.append(1), real(*args, **kw))[1]
    p, q = torch.zeros(4, requires_grad=True), torch.zeros(2, 3, requires_grad=True)
    p.grad = torch.arange(4.0) * (ctx.rank + 1)
    q.grad = None if ctx.rank == 1 else torch.ones(2, 3) * 6
    ctx.allreduce_grads((p, q))
    dist.all_reduce = real
    out["allreduce"] = [p.grad.tolist(), q.grad.reshape(-1).tolist(), len(calls)]
    # data parallel: sharded batch B + averaged gradient == gradient of batch 2B in one process
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    mine = DataStream("d", lambda: loader(8), rank=ctx.rank, world=ctx.world, seed=3)
    whole = DataStream("d", lambda: distributed_loader(loader(16), 0, 1, seed=3))
    errors = []
    for _ in range(6):                      # crosses an epoch (64 / 16 = 4 steps per epoch)
        w.grad = None
        loss(w, mine.next()).backward()
        ctx.allreduce_grads((w,))
        (reference,) = torch.autograd.grad(loss(w, whole.next()), (w,))
        errors.append((w.grad - reference).abs().max().item())
    out["dp_error"] = max(errors)
    ctx.barrier()
    # a second context in the same process (a second program) uses the same group
    group = dist.group.WORLD
    again = DistContext.from_env(timeout_s=60)
    c = torch.full((2,), float(again.rank + 5))
    again.broadcast_params((c,))
    out["again"] = [again.rank, again.world, dist.group.WORLD is group, c.tolist()]
    print(json.dumps(out))


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
