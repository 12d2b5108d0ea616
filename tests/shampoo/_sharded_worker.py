"""One rank of the sharded-roots test (tests/shampoo/test_sharded.py): joins a gloo group,
trains a few parameters with Shampoo on gradients every rank draws identically (as after
an all-reduce), the roots sharded across the ranks, and rank 0 saves the result."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from mloc.runtime.optim import shampoo
from mloc.runtime.processes.ending import end_rank

SHAPES = [(13, 7), (9, 9, 2), (5,), (30, 4)]
KW = dict(lr=0.05, block_size=4, update_every=2, start_preconditioning_step=1, graft="adagrad")
STEPS = 12


def train(params):
    gen = torch.Generator().manual_seed(0)
    opt = shampoo(**KW)
    opt.start()
    state = opt.init(params)
    with torch.no_grad():
        for _ in range(STEPS):
            grads = tuple(torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params)
            state = opt.commit(grads, state, params)
    opt.close()
    return opt, state


def initial():
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES)


if __name__ == "__main__":
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    params = initial()
    opt, state = train(params)
    assert opt.work.batch.shard == (rank, world)
    if rank == 0:
        torch.save({"params": params, "roots": state.roots}, out)
    dist.destroy_process_group()
    end_rank(0)                         # as a rank of mloc run does (mloc.runtime.processes.ending)
