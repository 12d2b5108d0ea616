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
accumulators overwritten (training): both are :func:`directions`, written once in the
algebra of :mod:`.ops`. :func:`diagonal` is ``∂D/∂g`` with the accumulators held constant
(SAMA).
"""

from __future__ import annotations

import torch

from mloc.runtime.optim.ops import FOREACH, FUNCTIONAL

ACCUMULATORS = {"none": 0, "sgd": 0, "adagrad": 1, "rmsprop": 1, "adam": 2}
"""Accumulator tensors per parameter: ``(v,)``, or ``(m, v)`` for ``adam``."""
EPS = 1e-10
ADAM_BETA1 = 0.9


def corrections(kind, b2, t):
    """``(1−β₁ᵗ, 1−β₂ᵗ, √(1−β₂ᵗ))``: all that ``adam`` grafting reads of the step ``t``,
    host arithmetic (computed before a compiled step, not in it); None for the other kinds,
    which read no step count."""
    if kind != "adam":
        return None
    c2 = 1 - b2**t
    return 1 - ADAM_BETA1**t, c2, c2**0.5


def directions(ops, kind, b2, t, g, accs, c=None) -> tuple[tuple, list]:
    """``(accumulators, D)`` of every tensor of the column ``g`` at step ``t``, the
    accumulators ``accs`` (per tensor, as :data:`ACCUMULATORS` says) updated, in the algebra
    of :mod:`.ops`: the module docstring's formulas, once for :meth:`Shampoo.update`
    (:data:`~.ops.FUNCTIONAL`, ``√`` with derivative 0 at 0: :func:`.ops.safe_sqrt`) and
    :meth:`Shampoo.commit` (:data:`~.ops.FOREACH`, the accumulators overwritten). ``c``:
    step ``t``'s :func:`corrections`, given (then ``t`` is not read) or None."""
    if kind in ("none", "sgd"):
        return tuple(accs), list(g)
    if kind == "adagrad":
        v = ops.add_sq_([acc[0] for acc in accs], g)                 # v + g²
    else:
        v = ops.ema_sq_([acc[-1] for acc in accs], g, b2)            # β₂v + (1-β₂)g²
    if kind != "adam":
        return tuple((vi,) for vi in v), ops.div(g, ops.add_(ops.safe_sqrt(v), EPS))
    c1, c2, root_c2 = corrections(kind, b2, t) if c is None else c
    m = ops.ema_([acc[0] for acc in accs], g, ADAM_BETA1)            # β₁m + (1-β₁)g
    denom = ops.add_(ops.bias_root(v, c2, root_c2), EPS)             # √v̂ + δ
    return tuple(zip(m, v)), ops.div_bias(m, denom, c1)               # m̂ / (√v̂ + δ)


def direction(kind, b2, t, g, acc):
    """``(new accumulators, D)`` for one tensor at step ``t``, out of place and
    differentiable (:func:`directions` under :data:`~.ops.FUNCTIONAL`)."""
    accs, d = directions(FUNCTIONAL, kind, b2, t, [g], [acc])
    return accs[0], d[0]


def directions_inplace(kind, b2, t, g, accs) -> list:
    """``D`` of every tensor of ``g`` (a list), each accumulator of ``accs`` overwritten
    (:func:`directions` under :data:`~.ops.FOREACH`)."""
    return directions(FOREACH, kind, b2, t, g, accs)[1]


def diagonal(kind, b2, t, acc):
    """``∂D/∂g`` with the accumulators (after step ``t``) held constant: a number or a tensor."""
    if kind in ("none", "sgd"):
        return 1.0
    if kind in ("adagrad", "rmsprop"):
        return 1.0 / (torch.sqrt(acc[0]) + EPS)
    b1 = ADAM_BETA1
    return (1 - b1) / (1 - b1**t) / (torch.sqrt(acc[1] / (1 - b2**t)) + EPS)
