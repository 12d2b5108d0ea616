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
