"""A tiny program whose data shuffles without a seeded generator (so that a resume says
mloc's warning about it), and whose data factory gives a warning of its own (the user's,
which keeps Python's format)."""

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Linear):
    def __init__(self):
        super().__init__(2, 2)


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.ones(()))


def data():
    warnings.warn("the user's own warning")
    x = torch.arange(16.0).reshape(8, 2) / 8
    return DataLoader(TensorDataset(x, (x[:, 0] > 0.5).long()), batch_size=2, shuffle=True)


def ce(net, scale, batch):
    x, y = batch
    return scale.s * F.cross_entropy(net(x), y)
