"""Synthetic classification data shared by the example programs.

No dataset is downloaded: `digits_like` draws a 10-class Gaussian mixture in 64 dimensions
(the shape of scikit-learn's 8x8 digits) from a fixed seed, so every run sees the same data.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset


def digits_like(n: int, *, seed: int, features: int = 64, classes: int = 10,
                spread: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` examples (x, y): class means fixed by a master seed, noise drawn from `seed`."""
    means = torch.randn(classes, features, generator=torch.Generator().manual_seed(1234)) * spread
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = means[y] + torch.randn(n, features, generator=g) * 3.0
    return x, y


def corrupt_labels(y: torch.Tensor, noise: float, *, classes: int = 10, seed: int = 0) -> torch.Tensor:
    """Replace a fraction `noise` of the labels with uniformly random (wrong or not) classes."""
    g = torch.Generator().manual_seed(seed)
    flip = torch.rand(y.shape, generator=g) < noise
    return torch.where(flip, torch.randint(0, classes, y.shape, generator=g), y)


def loader(x: torch.Tensor, y: torch.Tensor, batch_size: int, *, seed: int, shuffle: bool = True) -> DataLoader:
    """A seeded DataLoader over in-memory tensors (the runtime restarts it when exhausted)."""
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, drop_last=shuffle,
                      generator=torch.Generator().manual_seed(seed))
