"""Interlocking backpropagation (Gomez, Key et al., 2020) on a three-stage MLP.

Each stage is a block with an auxiliary classification head. A stage's loss runs the input
through every stage up to it and scores its own head; how far each loss's gradient may flow
back is the chain's `interlock = n` (1 local, 2 pairwise, 3 end-to-end).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synthetic import digits_like, loader


class Stage(nn.Module):
    def __init__(self, in_features: int, out_features: int, classes: int = 10):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(in_features, out_features), nn.ReLU())
        self.head = nn.Linear(out_features, classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h)


def digits(batch_size: int = 128, size: int = 5000):
    x, y = digits_like(size, seed=21)
    return loader(x, y, batch_size, seed=22)


def _head_loss(stages: tuple[Stage, ...], batch) -> torch.Tensor:
    x, y = batch
    h = x
    for stage in stages:
        h = stage(h)
    return F.cross_entropy(stages[-1].head(h), y)


def loss1(stage1: Stage, batch) -> torch.Tensor:
    return _head_loss((stage1,), batch)


def loss2(stage1: Stage, stage2: Stage, batch) -> torch.Tensor:
    return _head_loss((stage1, stage2), batch)


def loss3(stage1: Stage, stage2: Stage, stage3: Stage, batch) -> torch.Tensor:
    return _head_loss((stage1, stage2, stage3), batch)
