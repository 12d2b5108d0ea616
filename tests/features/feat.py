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


class Affine(nn.Module):
    """w·x through nn.Linear, whose matmul refuses mixed dtypes."""

    def __init__(self, n: int = 3):
        super().__init__()
        self.lin = nn.Linear(n, n)


def points64(n: int = 3, seed: int = 0, batch: int = 4):
    """`points` in float64 (for the dtype-mismatch test)."""
    return [b.double() for b in points(n, seed, batch)]


def fit_affine(model, hyper, batch):
    return 0.5 * (model.lin(batch) - batch).pow(2).mean() + 0.5 * (hyper.w.exp() * model.lin.weight.pow(2).sum(0)).sum()


def val_affine(model, batch):
    return 0.5 * (model.lin(batch) - batch).pow(2).mean()


def report(model):
    """An evaluation returning several metrics."""
    return {"w_norm": model.w.norm(), "w_max": float(model.w.max())}


def wrong_report(model):
    """An evaluation returning something that is not a metric."""
    return f"norm {float(model.w.norm()):.3f}"
