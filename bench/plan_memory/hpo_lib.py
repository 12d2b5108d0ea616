"""A weight-decay HPO problem for bench/plan_memory.py: an MLP and a few decay strengths."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, width: int = 256):
        super().__init__()
        self.l1, self.l2 = nn.Linear(64, width), nn.Linear(width, 10)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class Decay(nn.Module):
    """log-strengths of L2 penalties: `groups` of them, spread over the MLP's weights."""

    def __init__(self, groups: int = 2):
        super().__init__()
        self.log = nn.Parameter(torch.full((groups,), -4.0))

    def penalty(self, net):
        ws = [net.l1.weight, net.l2.weight]
        flat = torch.cat([w.reshape(-1) for w in ws])
        chunks = flat.chunk(self.log.numel())
        return sum(s.exp() * c.pow(2).sum() for s, c in zip(self.log, chunks))


def data(seed: int = 0, batch_size: int = 100):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2000, 64, generator=g)
    y = (x[:, :10].argmax(-1))
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed + 1))


def train_loss(net, decay, batch):
    x, y = batch
    return F.cross_entropy(net(x), y) + decay.penalty(net)


def val_loss(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y)
