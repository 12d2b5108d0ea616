"""Hyperparameter optimization: one weight-decay strength per feature (oracle R's shape).

The lower problem fits a logistic regression with penalty Σ_j exp(λ_j) w_j² / 2; the upper
problem tunes λ (in log space, so the penalty stays positive) on a validation split.
Only the first 5 of 30 features carry signal, so a good λ shrinks the other 25.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Logistic(nn.Module):
    def __init__(self, features: int = 30):
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(-1)


class LogPenalty(nn.Module):
    """λ ∈ R^features; the penalty weights are exp(λ)."""

    def __init__(self, features: int = 30, init: float = -2.0):
        super().__init__()
        self.log_decay = nn.Parameter(torch.full((features,), float(init)))

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.log_decay.exp() * w.pow(2)).sum()


def sparse_logistic(split: str = "train", n: int = 200, batch_size: int = 200, features: int = 30,
                    informative: int = 5):
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    w_true = torch.zeros(features)
    w_true[:informative] = torch.linspace(2.0, -2.0, informative)
    g = torch.Generator().manual_seed({"train": 11, "val": 12, "test": 13}[split])
    x = torch.randn(n, features, generator=g)
    y = (torch.rand(n, generator=g) < torch.sigmoid(x @ w_true)).float()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def penalized_bce(model: Logistic, penalty: LogPenalty, batch) -> torch.Tensor:
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x), y) + penalty(model.linear.weight.squeeze(0)) / len(y)


def shared_penalized_bce(model: Logistic, batch, log_decay: float = -2.0) -> torch.Tensor:
    """The baseline's lower loss (programs/hpo_grid.mlo): one weight decay exp(log_decay)
    shared by every feature, chosen from outside (`mloc sweep`), not learned."""
    x, y = batch
    w = model.linear.weight.squeeze(0)
    return F.binary_cross_entropy_with_logits(model(x), y) + 0.5 * math.exp(log_decay) * w.pow(2).sum() / len(y)


def bce(model: Logistic, batch) -> torch.Tensor:
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x), y)


@torch.no_grad()
def test_loss(model: Logistic, data) -> float:
    losses = [bce(model, b).item() for b in data]
    return sum(losses) / len(losses)
