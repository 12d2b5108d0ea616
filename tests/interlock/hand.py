"""The reference's hand-checkable chain and a small network, for the interlocking tests.

Hand case (``../shared/reference/interlocking.md``): three modules that multiply their
input elementwise by a parameter vector (2, 3, 4 in both entries), heads that multiply by
1 (the features are the logits), input [1, 1], target class 1 for the auxiliary heads
(cross-entropy: gradient softmax - onehot = [0.5, -0.5] at equal logits) and a final loss
whose gradient with respect to its logits is 0.1 (``0.1 * sum(logits)``), SGD with lr 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Scale(nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.w = nn.Parameter(torch.full((2,), float(value)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w * h


def one_example():
    """The same batch forever: x = [[1, 1]], y = [1]."""
    return [(torch.ones(1, 2), torch.tensor([1]))]


def aux1(stage1, batch):
    x, y = batch
    return F.cross_entropy(stage1(x), y)


def aux2(stage1, stage2, batch):
    x, y = batch
    return F.cross_entropy(stage2(stage1(x)), y)


def final3(stage1, stage2, stage3, batch):
    x, _ = batch
    return (0.1 * stage3(stage2(stage1(x)))).sum()


class Block(nn.Module):
    """A small stage: tanh(Wh + b), with an auxiliary linear head its forward does not use."""

    def __init__(self, fan_in: int, width: int, classes: int = 3):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(fan_in, width), nn.Tanh())
        self.head = nn.Linear(width, classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h)


def blobs(batch_size: int = 16):
    """A fixed, shuffled 3-class problem in 5 dimensions."""
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 3, (96,), generator=g)
    x = torch.randn(96, 5, generator=g) + torch.nn.functional.one_hot(y, 5).float() * 2.0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size,
                                       shuffle=True, drop_last=True,
                                       generator=torch.Generator().manual_seed(4))


def _scored(stages, batch):
    x, y = batch
    h = x
    for s in stages:
        h = s(h)
        h = h[0] if isinstance(h, tuple) else h     # (for `Pair`, which breaks the contract)
    return F.cross_entropy(stages[-1].head(h), y)


def loss1(stage1, batch):
    return _scored((stage1,), batch)


def loss2(stage1, stage2, batch):
    return _scored((stage1, stage2), batch)


def loss3(stage1, stage2, stage3, batch):
    return _scored((stage1, stage2, stage3), batch)


def tuned1(tuner, stage1, batch):
    """Stage 1's loss with a penalty read from an upper problem (a chain in a hierarchy)."""
    return loss1(stage1, batch) + 1e-3 * sum(p.pow(2).sum() for p in tuner.parameters())


class Pair(Block):
    """A stage that breaks the contract: its forward returns a tuple."""

    def forward(self, h):
        return self.block(h), h
