"""A data-reweighting program whose modules define parameters their losses never use: the
lower `net` has a BatchNorm and a head it never calls, the upper `weights` a head it never
calls (mloc must give them zero gradient and leave them untouched, as a hand loop does)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, width: int = 6):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))
        self.norm = nn.BatchNorm1d(width)      # defined, never called
        self.aux = nn.Linear(width, 2)         # an unused head

    def forward(self, x):
        return self.body(x)


class Weights(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid())
        self.spare = nn.Linear(1, 1)           # never called

    def forward(self, losses):
        return self.net(losses.unsqueeze(-1)).squeeze(-1)


def data(seed: int = 0, n: int = 64, batch_size: int = 16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed + 1))


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses) * losses).mean()


def ce(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)
