"""Small quadratic problems for tests/test_torch_optim.py and tests/test_schedules.py."""

import torch
from torch import nn


class Vector(nn.Module):
    def __init__(self, n: int = 3, value: float = 0.0):
        super().__init__()
        self.w = nn.Parameter(torch.full((n,), float(value)))


def points(n: int = 3, seed: int = 0, batch: int = 4):
    """A list of 8 batches of targets, fixed by the seed (the stream restarts it)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, generator=g) for _ in range(8)]


def fit(model, hyper, batch):
    """½‖w − mean(batch)‖² + ½ Σ exp(h) w²."""
    return 0.5 * (model.w - batch.mean(0)).pow(2).sum() + 0.5 * (hyper.w.exp() * model.w.pow(2)).sum()


def val(model, hyper, batch):
    """½‖w ⊙ exp(h) − mean(batch)‖²: reads h directly, so `first_order` moves it."""
    return 0.5 * (model.w * hyper.w.exp() - batch.mean(0)).pow(2).sum()


def make_optimizer(params, lr, rho=0.9):
    """A user factory: Adadelta with its own argument names."""
    return torch.optim.Adadelta(params, lr=lr, rho=rho)


def not_an_optimizer(params, lr):
    return [params, lr]


def make_scheduler(optimizer, every=2):
    """A user factory: halve the rate every `every` steps."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=every, gamma=0.5)


def sets_at_build(optimizer, key="epsilon", value=1e-4):
    """A user factory (tests/test_schedule_momentum.py): a constant-rate scheduler that
    sets `key` of the param group when it is built."""
    for group in optimizer.param_groups:
        group[key] = value
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


class _LateDecay(torch.optim.lr_scheduler.LRScheduler):
    """Constant rate; sets weight_decay to `value` from step `at` on."""

    def __init__(self, optimizer, at, value):
        self.at, self.value = at, value
        super().__init__(optimizer)

    def get_lr(self):
        if self.last_epoch >= self.at:
            for group in self.optimizer.param_groups:
                group["weight_decay"] = self.value
        return [group["lr"] for group in self.optimizer.param_groups]


def changes_later(optimizer, at=2, value=0.1):
    """A user factory: a scheduler that starts changing `weight_decay` at step `at`."""
    return _LateDecay(optimizer, at, value)
