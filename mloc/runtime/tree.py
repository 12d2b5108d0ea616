"""Arithmetic on parameter tuples (``tuple[Tensor, ...]``), the runtime's only container.

A problem's parameters, gradients, adjoints and optimizer buffers are flat tuples of
tensors, built once. These helpers are plain loops: for the handful of tensors of a model
they cost less than dispatching a foreach kernel, and they stay differentiable.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

Params = tuple[Tensor, ...]


def dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """⟨a, b⟩ summed over all tensors of the tuples (a 0-dim tensor, no host sync)."""
    total = (a[0] * b[0]).sum()
    for x, y in zip(a[1:], b[1:]):
        total = total + (x * y).sum()
    return total


def norm(a: Sequence[Tensor]) -> Tensor:
    """Euclidean norm of the concatenation of ``a``."""
    total = (a[0] * a[0]).sum()
    for x in a[1:]:
        total = total + (x * x).sum()
    return torch.sqrt(total)


def axpy(alpha, x: Sequence[Tensor], y: Sequence[Tensor]) -> Params:
    """``alpha * x + y``; ``alpha`` is a number or a 0-dim tensor. For a number, one fused
    kernel per tensor (``torch.add(y, x, alpha=alpha)``, a multiply-add) instead of two."""
    if isinstance(alpha, (int, float)):
        return tuple([torch.add(yi, xi, alpha=alpha) for xi, yi in zip(x, y)])
    return tuple([alpha * xi + yi for xi, yi in zip(x, y)])


def scale(alpha, x: Sequence[Tensor]) -> Params:
    """``alpha * x``."""
    return tuple([alpha * xi for xi in x])


def mul(x: Sequence, y: Sequence[Tensor]) -> Params:
    """Elementwise ``x ⊙ y``; entries of ``x`` may be numbers (a per-tensor scale)."""
    return tuple([xi * yi for xi, yi in zip(x, y)])


def add(x: Sequence[Tensor], y: Sequence[Tensor]) -> Params:
    return tuple([xi + yi for xi, yi in zip(x, y)])


def neg(x: Sequence[Tensor]) -> Params:
    return tuple([-xi for xi in x])


def detach(x: Sequence[Tensor], requires_grad: bool = False) -> Params:
    """Detached copies; with ``requires_grad`` they are fresh autograd leaves."""
    return tuple([xi.detach().requires_grad_(requires_grad) for xi in x])


def fill_none(grads: Sequence[Tensor | None], like: Sequence[Tensor]) -> Params | None:
    """Replace ``None`` gradients (unused inputs) by zeros; ``None`` if all were unused."""
    for g in grads:  # a plain loop: this sits on the hot path
        if g is None:
            break
    else:
        return tuple(grads)
    if all(g is None for g in grads):
        return None
    return tuple([torch.zeros_like(p) if g is None else g for g, p in zip(grads, like)])


def zeros(like: Sequence[Tensor]) -> Params:
    return tuple([torch.zeros_like(p) for p in like])


def dense(grads: Sequence[Tensor | None], like: Sequence[Tensor]) -> Params:
    """Like :func:`fill_none`, but all zeros rather than ``None`` when nothing was used."""
    return fill_none(grads, like) or zeros(like)
