"""A small, fast data-reweighting program for the run tests (synthetic data, tiny nets)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEP = {"n": 0}


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))

    def forward(self, x):
        return self.net(x)


class Weights(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid())

    def forward(self, losses):
        return self.net(losses.unsqueeze(-1)).squeeze(-1)


def data(seed: int = 0, n: int = 64, batch_size: int = 16, shuffle: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, drop_last=True,
                      generator=torch.Generator().manual_seed(seed + 1))


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses.detach()) * losses).mean()


def ce(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)


def ce_nan_after(net, batch, after: int = 7):
    """The clean loss, until the `after`-th call: then NaN (to test the NaN guard)."""
    STEP["n"] += 1
    loss = ce(net, batch)
    return loss * float("nan") if STEP["n"] > after else loss


@torch.no_grad()
def accuracy(net, data):
    x, y = data.dataset.tensors
    return (net(x).argmax(-1) == y).float().mean().item()


def ce_raising_after(net, batch, after: int = 7):
    """The clean loss, until the `after`-th call: then a ValueError (a bug in user code)."""
    STEP["n"] += 1
    if STEP["n"] > after:
        raise ValueError("labels out of range")
    return ce(net, batch)
