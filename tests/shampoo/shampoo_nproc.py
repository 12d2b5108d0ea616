"""A tiny two-level program's code for the ``mloc run --nproc`` Shampoo tests
(tests/shampoo/test_nproc_run.py): synthetic data, no evaluations (``--dtype float64``
casts the modules and batches; an evaluation reading its dataset directly would not be)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """4 → width → 3: weights (width, 4) and (3, width), biases (width,) and (3,)."""

    def __init__(self, width: int = 24):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))

    def forward(self, x):
        return self.net(x)


class Weights(nn.Module):
    """Per-example loss weights in (0, 1)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid())

    def forward(self, losses):
        return self.net(losses.unsqueeze(-1)).squeeze(-1)


def data(seed: int = 0, n: int = 128, batch_size: int = 16):
    """In order (no shuffling): ``--nproc 2`` with ``batch_size=8`` reads, step by step, the
    same 16 examples as one process with ``batch_size=16`` (mloc/runtime/data.py)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, drop_last=True)


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses.detach()) * losses).mean()


def ce(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)
