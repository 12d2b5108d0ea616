"""Small quadratic problems for the language-feature tests (tests/test_features.py)."""

import torch
from torch import nn


class Vector(nn.Module):
    def __init__(self, n: int = 3, value: float = 0.0):
        super().__init__()
        self.w = nn.Parameter(torch.full((n,), float(value)))


def points(n: int = 3, seed: int = 0, batch: int = 4):
    """An endless list of batches of targets, fixed by the seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, generator=g) for _ in range(8)]


def fit(model, hyper, batch):
    """½‖w − mean(batch)‖² + ½ Σ exp(h) w²."""
    return 0.5 * (model.w - batch.mean(0)).pow(2).sum() + 0.5 * (hyper.w.exp() * model.w.pow(2)).sum()


def val(model, batch):
    return 0.5 * (model.w - batch.mean(0)).pow(2).sum()


def clamp(module, lo: float = -1.0, hi: float = 1.0):
    module.w.clamp_(lo, hi)


def broken(module):
    raise ValueError("no projection today")
