"""The model and data of `bench/overlap.py`: a deep MLP classifier (several DDP-sized
buckets of gradient) reweighted by a small weight net, on fixed synthetic data."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 256, 10


class MLP(nn.Module):
    def __init__(self, width: int = 1024, depth: int = 3):
        super().__init__()
        dims = [FEATURES] + [width] * depth
        layers = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
        self.net = nn.Sequential(*layers, nn.Linear(width, CLASSES))

    def forward(self, x):
        return self.net(x)


class WeightNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 100), nn.ReLU(), nn.Linear(100, 1), nn.Sigmoid())

    def forward(self, losses):
        return self.net(losses.unsqueeze(-1)).squeeze(-1)


def data(seed: int = 0, n: int = 2000, batch_size: int = 100):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed + 1))


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses.detach()) * losses).mean()


def ce(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)
