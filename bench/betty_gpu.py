"""Betty 0.2.1 on data_reweighting.mlo's program, one process or under torchrun: time per
outer step and peak memory, for `bench/dp_gpu.py`'s table (a GPU machine's run; see
`bench/device_check.sh`).

The program of `programs/data_reweighting.mlo` written for Betty: the 64-256-10 classifier
with SGD (lr 0.02, momentum 0.9, weight decay 5e-4) on 40%-noisy digits, the 1-100-1 weight
net with Adam (lr 1e-2, weight decay 1e-4) on the clean set, batch 100 per process, one
lower step per upper step. ``--method``: ``darts`` (mloc's ``finite_diff``), ``sama`` or
``neumann`` (3 iterations, alpha 0.1). ``--strategy default`` runs one process on
``--device``; ``distributed`` is Betty's DistributedDataParallel strategy (nccl, one GPU per
process; Betty requires CUDA and more than one process for it):

    python3 bench/betty_gpu.py --method sama --device cuda
    torchrun --nproc-per-node 2 bench/betty_gpu.py --method sama --strategy distributed

Prints one JSON line (rank 0): the median milliseconds of an outer step over the timed
steps (after ``--warmup``; the device synchronised around each) and the peak memory
(``torch.cuda.max_memory_allocated`` on CUDA; absent on the CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "programs"))

import reweighting as lib  # noqa: E402


def build(method: str, strategy: str):
    from betty.configs import Config, EngineConfig
    from betty.engine import Engine
    from betty.logging.logger_base import get_logger
    from betty.problems import ImplicitProblem

    get_logger().setLevel(logging.WARNING)

    class Classifier(ImplicitProblem):
        def training_step(self, batch):
            return lib.weighted_ce(self.module, self.weight_net, batch)

    class WeightNet(ImplicitProblem):
        def training_step(self, batch):
            return lib.ce(self.classifier, batch)

    torch.manual_seed(0)
    classifier, weight_net = lib.MLP(in_features=64, hidden=256, classes=10), lib.WeightNet(hidden=100)
    lower = Classifier(name="classifier", module=classifier,
                       config=Config(type=method, darts_alpha=0.01, neumann_iterations=3, neumann_alpha=0.1),
                       optimizer=torch.optim.SGD(classifier.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4),
                       train_data_loader=lib.noisy_digits(noise=0.4, batch_size=100))
    upper = WeightNet(name="weight_net", config=Config(), module=weight_net,
                      optimizer=torch.optim.Adam(weight_net.parameters(), lr=1e-2, weight_decay=1e-4),
                      train_data_loader=lib.clean_digits(batch_size=100))
    engine = Engine(problems=[upper, lower],
                    config=EngineConfig(train_iters=10**9, strategy=strategy, logger_type="none"),
                    dependencies={"u2l": {upper: [lower]}, "l2u": {lower: [upper]}})
    engine.train()      # with train_iters this large, only the set-up (Betty trains in train_step)
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("darts", "sama", "neumann"), default="sama")
    parser.add_argument("--strategy", choices=("default", "distributed"), default="default")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (--strategy default only)")
    parser.add_argument("--steps", type=int, default=300, help="timed outer steps")
    parser.add_argument("--warmup", type=int, default=30, help="untimed outer steps first")
    args = parser.parse_args()
    strategy = args.strategy if args.strategy == "distributed" else ("cpu" if args.device == "cpu" else "default")
    engine = build(args.method, strategy)
    cuda = args.device != "cpu" or args.strategy == "distributed"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = []
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        engine.global_step += 1
        engine.train_step()
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    if int(os.environ.get("RANK", "0")) == 0:
        row = {"system": "betty", "method": args.method, "strategy": args.strategy,
               "world": int(os.environ.get("WORLD_SIZE", "1")), "ms_per_step": statistics.median(times) * 1e3}
        if cuda:
            row["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
