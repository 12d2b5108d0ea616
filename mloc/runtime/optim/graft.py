r"""The diagonal optimizers Shampoo grafts onto (Agarwal et al., "Disentangling Adaptive
Gradient Methods from Learning Rates", 2020; Anil et al. 2020 §4): per tensor, a direction
``D`` whose norm the preconditioned direction takes, and the direction itself where a
tensor is not preconditioned (before the start, 1-D tensors).

- ``sgd``/``none``: ``D = g``;
- ``adagrad``: ``v ← v + g²``, ``D = g/(√v + δ)``;
- ``rmsprop``: ``v ← β₂v + (1−β₂)g²``, ``D = g/(√v + δ)`` (no bias correction);
- ``adam``: ``m ← β₁m + (1−β₁)g``, ``v`` as rmsprop, ``D = m̂/(√v̂ + δ)`` with the bias
  corrections ``m̂ = m/(1−β₁ᵗ)``, ``v̂ = v/(1−β₂ᵗ)``, ``β₁ = 0.9``;

``δ = 1e-10``, ``β₂ = graft_beta2``. :func:`direction` is out of place and differentiable
(``itd``), :func:`directions_inplace` the same formulas over all tensors at once with the
accumulators overwritten (training), :func:`diagonal` ``∂D/∂g`` with the accumulators held
constant (SAMA).
"""

from __future__ import annotations

import torch

ACCUMULATORS = {"none": 0, "sgd": 0, "adagrad": 1, "rmsprop": 1, "adam": 2}
"""Accumulator tensors per parameter: ``(v,)``, or ``(m, v)`` for ``adam``."""
EPS = 1e-10
ADAM_BETA1 = 0.9


def direction(kind, b2, t, g, acc):
    """``(new accumulators, D)`` for one tensor at step ``t`` (out of place)."""
    if kind in ("none", "sgd"):
        return acc, g
    if kind == "adagrad":
        v = acc[0] + g * g
        return (v,), g / (_sqrt(v) + EPS)
    v = b2 * acc[-1] + (1 - b2) * g * g
    if kind == "rmsprop":
        return (v,), g / (_sqrt(v) + EPS)
    b1 = ADAM_BETA1
    m = b1 * acc[0] + (1 - b1) * g
    mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
    return (m, v), mhat / (_sqrt(vhat) + EPS)


def _sqrt(v):
    """``√v``, the same numbers, with derivative 0 instead of ``∞`` where ``v`` is 0 (an entry
    whose gradient has been exactly 0 so far, e.g. a dead unit's: ``∞·0`` made the
    hypergradient NaN under ``itd``, MAML's inner loop on Shampoo with AdaGrad grafting).
    The derivative of ``g/(√v + δ)`` there is then ``1/δ``, that of the function as written."""
    positive = v > 0
    return torch.where(positive, torch.where(positive, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


def directions_inplace(kind, b2, t, g, accs) -> list:
    """``D`` of every tensor of ``g`` (a list), each accumulator of ``accs`` overwritten:
    :func:`direction`'s formulas as one ``torch._foreach_*`` call each."""
    if kind in ("none", "sgd"):
        return list(g)
    v = [acc[-1] for acc in accs]
    if kind == "adagrad":
        torch._foreach_addcmul_(v, g, g)
    else:
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
    denom = torch._foreach_sqrt(v)
    if kind == "adam":
        b1 = ADAM_BETA1
        m = [acc[0] for acc in accs]
        torch._foreach_lerp_(m, g, 1 - b1)
        torch._foreach_div_(denom, (1 - b2**t) ** 0.5)
        torch._foreach_add_(denom, EPS)
        out = torch._foreach_div(m, denom)
        torch._foreach_div_(out, 1 - b1**t)
        return list(out)
    torch._foreach_add_(denom, EPS)
    return list(torch._foreach_div(g, denom))


def diagonal(kind, b2, t, acc):
    """``∂D/∂g`` with the accumulators (after step ``t``) held constant: a number or a tensor."""
    if kind in ("none", "sgd"):
        return 1.0
    if kind in ("adagrad", "rmsprop"):
        return 1.0 / (torch.sqrt(acc[0]) + EPS)
    b1 = ADAM_BETA1
    return (1 - b1) / (1 - b1**t) / (torch.sqrt(acc[1] / (1 - b2**t)) + EPS)
