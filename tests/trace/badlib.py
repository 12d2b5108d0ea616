"""Python code with the mistakes the dataflow pass must catch (imported by test programs)."""

import torch
from torch import nn

_REGISTRY = {}


class Net(nn.Module):
    def __init__(self, width: int = 4, fail: bool = False):
        super().__init__()
        if fail:
            raise ValueError("width must be even")
        self.fc = nn.Linear(width, 1)
        _REGISTRY["last"] = self

    def forward(self, x):
        return self.fc(x)


class Scale(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(width))
        _REGISTRY["scale"] = self


def loader(batch_size: int = 8):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch_size, 4, generator=g), torch.randn(batch_size, 1, generator=g))]


def weighted(net, scale, batch):
    x, y = batch
    return ((net(x * scale.log_scale.exp()) - y) ** 2).mean()


def detached(net, scale, batch):
    x, y = batch
    return ((net(x * scale.log_scale.exp().detach()) - y) ** 2).mean()


def per_example(net, scale, batch):
    x, y = batch
    return (net(x * scale.log_scale.exp()) - y) ** 2


def hidden_scale(net, batch):
    x, y = batch
    return ((net(x * _REGISTRY["scale"].log_scale.exp()) - y) ** 2).mean()


def val(net, batch):
    x, y = batch
    return ((net(x) - y) ** 2).mean()


def val_hidden(net, batch):
    """Reads the Scale module through a global: a dependency the .mlo file cannot see."""
    x, y = batch
    return ((net(x * _REGISTRY["scale"].log_scale.exp()) - y) ** 2).mean()
