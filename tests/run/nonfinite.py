"""NaN and Inf injected into one step of the small program (``small.py``), for the tests
that no checkpoint ever holds a non-finite parameter or optimizer state.

Every batch is ``(x, y, poison)``; ``poison`` is 1 in the ``at``-th batch a stream yields
(1-based: the problem's ``at``-th step, one batch per step) and 0 elsewhere, so the step
that goes wrong is known exactly, whatever a method calls the losses for. What goes wrong
is ``inject``:

- ``"loss"``: the loss is NaN;
- ``"grad"``: the loss is finite, one entry of the gradient of the logits is NaN (so are
  the parameters' gradients it reaches);
- ``"inf"``: the loss is finite, one entry of the gradient of the logits is +Inf;
- ``"huge"``: the loss and the gradient are finite, one entry is 1e30, whose square
  overflows float32 (an optimizer statistic, a second moment or a Shampoo statistic,
  becomes Inf while everything the step received was finite).

In the lower loss (``weighted``) it hits the lower problem's gradient; in the upper loss
(``ce``) the upper problem's hypergradient (through the lower's best response).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from small import Net, Weights  # noqa: F401

VALUES = {"grad": float("nan"), "inf": float("inf"), "huge": 1e30}


def data(seed: int = 0, batch_size: int = 16, at: int = 0, batches: int = 24):
    """``batches`` batches of the small program's task, the ``at``-th poisoned (0: none)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(1, batches + 1):
        x = torch.randn(batch_size, 4, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        out.append((x, y, torch.tensor(1.0 if i == at else 0.0)))
    return out


class _Poison(torch.autograd.Function):
    """The identity; its backward adds ``value`` to entry [0, 0] where ``flag`` is 1."""

    @staticmethod
    def forward(ctx, logits, flag, value):
        ctx.save_for_backward(flag)
        ctx.value = value
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx, grad):
        (flag,) = ctx.saved_tensors
        grad = grad.clone()
        grad[0, 0] = torch.where(flag > 0, ctx.value, grad[0, 0])   # no read-back: a compiled step captures it
        return grad, None, None


def _logits(net, x, flag, inject):
    logits = net(x)
    return _Poison.apply(logits, flag, VALUES[inject]) if inject in VALUES else logits


def _loss(value, flag, inject):
    return torch.where(flag > 0, torch.full_like(value, float("nan")), value) if inject == "loss" else value


def weighted(net, weights, batch, inject: str = "none"):
    """The lower loss: per-example cross-entropy weighted by the weight net."""
    x, y, flag = batch
    losses = F.cross_entropy(_logits(net, x, flag, inject), y, reduction="none")
    return _loss((weights(losses.detach()) * losses).mean(), flag, inject)


def ce(net, batch, inject: str = "none"):
    """The upper loss: cross-entropy of the lower's classifier on the upper's batch."""
    x, y, flag = batch
    return _loss(F.cross_entropy(_logits(net, x, flag, inject), y), flag, inject)


@torch.no_grad()
def accuracy(net):
    """Accuracy on 64 held-out examples (NaN logits count as wrong)."""
    x, y, _ = data(seed=20, batch_size=64, batches=1)[0]
    return (net(x).argmax(-1) == y).float().mean().item()
