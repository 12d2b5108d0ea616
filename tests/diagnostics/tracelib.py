"""A module the trace-time corpus cases run at compile time (E7xx found in the user's values:
wrong data, a loss detached by `.item()`, `init` between modules that differ)."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(width, 1)

    def forward(self, x):
        return self.fc(x)


class Renamed(nn.Module):
    """`Net` with its layer named `lin`: the same shapes, other names."""

    def __init__(self, width=4):
        super().__init__()
        self.lin = nn.Linear(width, 1)

    def forward(self, x):
        return self.lin(x)


class Headed(nn.Module):
    """`Net` with a head `aux` it never calls (W108)."""

    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(width, 1)
        self.aux = nn.Linear(width, 2)

    def forward(self, x):
        return self.fc(x)


class Scale(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.s = nn.Parameter(torch.ones(width))


def loader():
    return [(torch.zeros(8, 4), torch.zeros(8))]


def one_batch():
    """The fields of one batch, not an iterable of batches."""
    return torch.zeros(8, 4), torch.zeros(8)


class Examples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(4), torch.zeros(())


def examples():
    return Examples()


def fit(model, scale, batch):
    x, y = batch
    return ((model(x * scale.s).squeeze(-1) - y) ** 2).mean()


def val(model, batch):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def fit_item(model, batch):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean().item()


class Stage(nn.Module):
    """A depthwise stage of an interlocking chain (4 features in and out) with a head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, h):
        return torch.tanh(self.body(h))


def stage1_loss(stage1, batch):
    x, y = batch
    return ((stage1.head(stage1(x)).squeeze(-1) - y) ** 2).mean()


def stage2_twice_loss(stage1, stage2, batch):
    """Calls stage1 twice: a chain step would hand the second call stage1's features again."""
    x, y = batch
    return ((stage2.head(stage2(stage1(stage1(x)))).squeeze(-1) - y) ** 2).mean()
