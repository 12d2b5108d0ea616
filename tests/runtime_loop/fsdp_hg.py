"""The modules, data and losses of fsdp_hg.mlo (the sharded hypergradient and bf16 tests):
a 4-8-3 classifier trained on per-example losses weighted by a 1-4-1 net, whose own loss
reads it through its forward too (a direct term), so every method that shards, first_order
included, gives it a nonzero hypergradient."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DECAY = 1e-2


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))

    def forward(self, x):
        return self.net(x)


class Weights(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))

    def forward(self, losses):
        return torch.sigmoid(self.net(losses.unsqueeze(-1))).squeeze(-1)


def data(seed: int = 0, n: int = 128, batch_size: int = 16):
    """In order (no shuffle): two ranks with batch B see one process's batch 2B."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, drop_last=True)


def weighted(net, weights, batch):
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (weights(losses.detach()) * losses).mean()


def validation(net, weights, batch):
    """The classifier's loss plus ``DECAY`` times the mean square of the weights' outputs."""
    x, y = batch
    losses = F.cross_entropy(net(x), y, reduction="none")
    return losses.mean() + DECAY * weights(losses.detach()).pow(2).mean()
