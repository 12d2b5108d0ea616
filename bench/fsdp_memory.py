"""Per-rank parameter and optimizer-state bytes: FSDP2 sharded modules against replicas.

For each world size N (``--worlds``, default 1 2 4) this starts N processes (gloo on
127.0.0.1, one thread each) that build the same model, a ``--width``-wide MLP
(64-W-W-W-10, float32), and Adam's state over it (:func:`mloc.runtime.optim.adam`):

- ``ddp``: every rank holds the whole model and state (what ``--nproc N`` replicates today;
  ``DistributedDataParallel`` holds the same tensors, plus its gradient buckets);
- ``fsdp``: the model sharded with :func:`mloc.runtime.base.fsdp.shard` (``fully_shard`` per
  child with parameters, then the root) and Adam's state over the local shards
  (:class:`mloc.runtime.base.fsdp.Sharded`), after one training step (one sharded forward,
  ``backward()`` and commit, so the numbers are those of a live run).

Bytes are counted from the tensors a rank keeps: ``params`` the local shards' elements,
``storage`` the storage behind them (FSDP2 pads each parameter's shard to ``⌈rows/N⌉`` rows:
the padding shows here), ``state`` Adam's two moments. The ratio to ``ddp`` is printed per
N; 1/N is the ideal. The largest rank is reported (with uneven rows the first ranks hold
one row more).

    python bench/fsdp_memory.py [--width 1024] [--worlds 1 2 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def worker(width: int) -> dict:
    from mloc.runtime import optim
    from mloc.runtime.base import fsdp
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    whole = model(width)
    replica = {"params": _bytes(whole.parameters()), "storage": _bytes(whole.parameters()),
               "state": 2 * _bytes(whole.parameters())}
    net = fsdp.shard(model(width))
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    p = fsdp.Sharded("net", net, optim.adam(1e-3), lambda: nn.functional.cross_entropy(net(x), y))
    fsdp.plain_step(p, [p])
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in p.local}
    sharded = {"params": fsdp.param_bytes(net), "storage": sum(storages.values()),
               "state": _bytes(p.state.mu) + _bytes(p.state.nu)}
    out = {"rank": dist.get_rank(), "ddp": replica, "fsdp": sharded}
    dist.destroy_process_group()
    return out


def measure(world: int, width: int) -> list[dict]:
    sys.path.insert(0, ROOT)
    from mloc.runtime.processes.workers import free_port
    port, procs = free_port(), []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--width", str(width)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"a rank failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.width)), flush=True)
        return
    rows = []
    print(f"64-{a.width}-{a.width}-{a.width}-10 MLP, float32, Adam; bytes on the largest rank")
    print(f"{'N':>2} {'ddp params':>11} {'fsdp params':>12} {'ratio':>6} {'fsdp storage':>13} "
          f"{'ratio':>6} {'ddp state':>10} {'fsdp state':>11} {'ratio':>6}")
    for n in a.worlds:
        res = measure(n, a.width)
        big = {k: max(r["fsdp"][k] for r in res) for k in ("params", "storage", "state")}
        ddp = res[0]["ddp"]
        row = {"world": n, "ddp": ddp, "fsdp": big}
        rows.append(row)
        print(f"{n:>2} {ddp['params']:>11} {big['params']:>12} {big['params'] / ddp['params']:>6.3f} "
              f"{big['storage']:>13} {big['storage'] / ddp['params']:>6.3f} {ddp['state']:>10} "
              f"{big['state']:>11} {big['state'] / ddp['state']:>6.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
