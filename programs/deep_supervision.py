"""Interlocking backpropagation (Gomez, Key et al., 2020) on stage-wise MLPs.

Each stage is a block with an auxiliary classification head. A stage's loss runs the input
through every stage up to it and scores its own head; how far each loss's gradient may flow
back is the chain's `interlock = n` (1 local, 2 pairwise, ..., K end-to-end).

What the runtime asks of these modules (see `mloc.runtime.grad.interlock`): a stage's `forward`
maps the previous stage's features (one tensor) to its own; its head is a part of the
module that `forward` does not use (`self.head`); the loss of stage k calls stages 1..k
once each, in order, then the head of stage k. Nothing else: ordinary PyTorch.

`digits(...)` is a synthetic 64-feature, 10-class mixture (no download); `sk_digits(...)`
is scikit-learn's real 8x8 digits (1797 images, shipped with scikit-learn): a fixed split
of 1397 training and 400 test images, pixels scaled to [0, 1].
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


def loss4(stage1: Stage, stage2: Stage, stage3: Stage, stage4: Stage, batch) -> torch.Tensor:
    return _head_loss((stage1, stage2, stage3, stage4), batch)


def _sk_digits(train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:   # the program's error: say what to install
        raise ImportError("sk_digits needs scikit-learn (pip install scikit-learn)") from e
    d = load_digits()
    order = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(0))
    x = torch.tensor(d.data, dtype=torch.float32)[order] / 16.0
    y = torch.tensor(d.target, dtype=torch.long)[order]
    return (x[:1397], y[:1397]) if train else (x[1397:], y[1397:])


def sk_digits(batch_size: int = 64):
    """scikit-learn's digits, the 1397 training images, shuffled (seeded) every epoch."""
    x, y = _sk_digits(train=True)
    return loader(x, y, batch_size, seed=22)


def sk_digits_test():
    """The 400 held-out images, as one batch."""
    return _sk_digits(train=False)


def accuracy(*stages_and_data) -> float:
    """Test accuracy of the network (every stage, then the last stage's head)."""
    *stages, (x, y) = stages_and_data
    h = x.to(next(stages[0].parameters()).dtype)
    for stage in stages:
        h = stage(h)
    return (stages[-1].head(h).argmax(1) == y).float().mean().item()
