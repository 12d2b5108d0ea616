"""Meta-Weight-Net (Shu et al., 2019): learn per-example loss weights on noisy labels.

The classifier (lower problem) minimises a weighted cross-entropy on noisy data, each
example weighted by a small network of its own loss; the weight net (upper problem) is
tuned so that the classifier does well on a small clean set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synthetic import corrupt_labels, digits_like, loader


class MLP(nn.Module):
    def __init__(self, in_features: int = 64, hidden: int = 256, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class WeightNet(nn.Module):
    """Maps an example's loss to its weight in (0, 1): 1 -> hidden -> 1, sigmoid output."""

    def __init__(self, hidden: int = 100):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, 1), nn.Sigmoid())

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        return self.net(losses.unsqueeze(-1)).squeeze(-1)


def noisy_digits(noise: float = 0.4, batch_size: int = 100, size: int = 5000, features: int = 64):
    x, y = digits_like(size, seed=1, features=features)
    return loader(x, corrupt_labels(y, noise, seed=2), batch_size, seed=3)


def clean_digits(batch_size: int = 100, size: int = 500, features: int = 64):
    x, y = digits_like(size, seed=4, features=features)
    return loader(x, y, batch_size, seed=5)


def test_digits(size: int = 2000):
    x, y = digits_like(size, seed=6)
    return loader(x, y, size, seed=7, shuffle=False)


def weighted_ce(classifier: nn.Module, weight_net: nn.Module, batch) -> torch.Tensor:
    """Σ_i w(ℓ_i) ℓ_i / Σ_i w(ℓ_i), the weight net reading each example's (detached) loss.

    Normalised by the weights' sum, as in the Meta-Weight-Net reference code: with a plain
    mean the weights' overall scale multiplies the classifier's learning rate, and the
    hypergradient then mostly learns that scale (here: weights *growing* with the loss)
    instead of which examples to trust."""
    x, y = batch
    losses = F.cross_entropy(classifier(x), y, reduction="none")
    weights = weight_net(losses.detach())
    return (weights * losses).sum() / weights.sum().clamp_min(1e-8)


def ce(classifier: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(classifier(x), y)


@torch.no_grad()
def accuracy(classifier: nn.Module, data) -> float:
    correct = total = 0
    for x, y in data:
        correct += (classifier(x).argmax(-1) == y).sum().item()
        total += len(y)
    return correct / max(total, 1)
