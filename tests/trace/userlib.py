"""The user's module of tests/test_trace_diagnostics.py: data of the wrong kinds, a loss that
calls `.item()`, one that raises two calls deep, and two modules alike but for names."""

import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(width, 1)


class Net2(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.lin = nn.Linear(width, 1)


class Hyper(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(width))


def loader(batch_size=8):
    return [(torch.zeros(batch_size, 4), torch.zeros(batch_size))]


def an_int():
    return 3


def a_tuple():
    return (torch.zeros(8, 4), torch.zeros(8))


def arrays():
    return np.zeros((8, 4), dtype=np.float32)


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.zeros(4), torch.zeros(())


def dataset():
    return DS()


def loss(model, hyper, batch):
    x, y = batch
    return ((model.fc(x * hyper.scale).squeeze(-1) - y) ** 2).mean()


def loss_item(model, hyper, batch):
    return loss(model, hyper, batch).item()


def helper(x):
    return x.reshape(3, 7)


def loss_raises(model, hyper, batch):
    x, y = batch
    return helper(x).sum() + loss(model, hyper, batch)


def upper(model, batch):
    x, y = batch
    return ((model.fc(x).squeeze(-1) - y) ** 2).mean()


def array_batches():
    return [(np.zeros((8, 4), dtype=np.float32), np.zeros(8, dtype=np.float32))]


def task_loss(model, batch):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


class Renamed(nn.Module):
    """`Net` with its layer named `lin`: the same shapes, other names."""

    def __init__(self, width=4):
        super().__init__()
        self.lin = nn.Linear(width, 1)

    def forward(self, x):
        return self.lin(x)


class Same(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(width, 1)

    def forward(self, x):
        return self.fc(x)


def no_batches():
    return []


def nothing():
    yield from ()
