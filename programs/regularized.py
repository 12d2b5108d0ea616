"""A three-level program: data reweighting whose weight net is itself regularised by a
strength tuned on held-out data.

    strength (top)      -> held-out loss of the classifier
    weight_net (middle) -> clean-set loss of the classifier + exp(s)·‖weight net‖²
    classifier (bottom) -> weighted noisy-label loss

The middle loss reads the classifier, which sits below it: the case where `exact` and
Betty's `per_edge` hypergradients differ.
"""

from __future__ import annotations

import torch
from torch import nn

from reweighting import MLP, WeightNet, accuracy, ce, clean_digits, noisy_digits, test_digits, weighted_ce
from synthetic import digits_like, loader

__all__ = ["MLP", "WeightNet", "Strength", "accuracy", "ce", "clean_digits", "noisy_digits",
           "test_digits", "weighted_ce", "heldout_digits", "regularized_ce"]


class Strength(nn.Module):
    """A single log-strength s; the regulariser is exp(s)·Σ p² over a module's parameters."""

    def __init__(self, init: float = -4.0):
        super().__init__()
        self.log_strength = nn.Parameter(torch.tensor(float(init)))

    def forward(self, module: nn.Module) -> torch.Tensor:
        return self.log_strength.exp() * sum(p.pow(2).sum() for p in module.parameters())


def heldout_digits(batch_size: int = 100, size: int = 500):
    x, y = digits_like(size, seed=8)
    return loader(x, y, batch_size, seed=9)


def regularized_ce(classifier: nn.Module, weight_net: nn.Module, strength: Strength, batch) -> torch.Tensor:
    return ce(classifier, batch) + strength(weight_net)
