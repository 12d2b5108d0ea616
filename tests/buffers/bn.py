"""A data-reweighting program whose modules have BatchNorm (and dropout), for the buffer
and evaluation-mode rules (docs/runtime.md, "Module buffers")."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.BatchNorm1d(width), nn.Tanh(),
                                 nn.Dropout(0.2), nn.Linear(width, 3))

    def forward(self, x):
        return self.net(x)


class Weights(nn.Module):
    """Per-example weights from the losses; its own BatchNorm sees every forward."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(1)
        self.net = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid())

    def forward(self, losses):
        return self.net(self.norm(losses.unsqueeze(-1))).squeeze(-1)


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


def meta(net, weights, batch):
    """The clean loss, plus a small penalty that runs the upper's own module once."""
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return losses.mean() + 1e-3 * weights(losses.detach()).mean()


def training_flags(net, weights):
    """1.0 for every module in training mode (an evaluation should see 0)."""
    return float(sum(m.training for m in (*net.modules(), *weights.modules())))


def accuracy(net, data):
    x, y = data.dataset.tensors
    return (net(x).argmax(-1) == y).float().mean().item()
