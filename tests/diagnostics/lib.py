"""A tiny Python module the bad programs import; never executed by `mloc check`."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.fc = nn.Linear(width, 1)


class HyperNet(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(width))


def loader(batch_size: int = 8):
    return [(torch.zeros(batch_size, 4), torch.zeros(batch_size))]


def loss(*problems_and_batch):
    return torch.zeros(())


def score(*problems):
    return 0.0


class Stage(nn.Module):
    """One depthwise stage of an interlocking chain, with an auxiliary head."""

    def __init__(self, in_features: int = 4, out_features: int = 4):
        super().__init__()
        self.body = nn.Linear(in_features, out_features)
        self.head = nn.Linear(out_features, 1)


def stage_loss(*stages_and_batch):
    return torch.zeros(())


def accuracy(*problems_and_data):
    return 0.0


def test_data(batch_size: int = 8):
    return loader(batch_size)


def clamp(*problems):
    """A projection or re-initialization (the E215/E216 corpus cases)."""


def pair_loss(model, hyper, batch):
    """A loss with a fixed signature (the E306 arity case)."""
    return torch.zeros(())


class Sized(nn.Module):
    def __init__(self, width, depth=1, *, bias=True):
        super().__init__()
        self.fc = nn.Linear(width, 1, bias=bias)
