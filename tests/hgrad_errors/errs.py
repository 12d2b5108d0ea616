"""Program code that raises where only the real computation sees it: a module constructor on
the real device (the trace builds modules on the meta device), and a loss after some calls."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CALLS = {"n": 0}


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


class RealOnly(Weights):
    """Builds on the meta device (the trace); raises on a real one."""

    def __init__(self):
        super().__init__()
        if torch.empty(0).device.type != "meta":
            raise ValueError("no weights file at ./weights.pt")


def data(seed: int = 0, n: int = 64, batch_size: int = 16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed + 1))


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses.detach()) * losses).mean()


def ce(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)


def ce_raising_after(net, batch, after: int = 7):
    """The clean loss, until the `after`-th call: then a ValueError (a bug in user code)."""
    CALLS["n"] += 1
    if CALLS["n"] > after:
        raise ValueError("labels out of range")
    return ce(net, batch)
