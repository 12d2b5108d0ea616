r"""The algebra an optimizer's step is written in, once, and its two interpreters.

An optimizer writes its step one time, as a function ``step(ops, ...)`` that calls the
operations below on *columns* (a list of tensors, one per parameter) and numbers. The
interpreter passed as ``ops`` decides what the operations do:

- :data:`FUNCTIONAL`: out of place and differentiable (``update``; the unrolled steps of
  ``itd``, where a hyperparameter may be a tensor autograd differentiates).
- :data:`INPLACE` and :data:`FOREACH`: the training step (``commit``, under
  ``torch.no_grad``, every hyperparameter a number): state buffers are overwritten with
  ``torch.optim``'s fused kernels, one call per tensor (:data:`INPLACE`: the kernels of
  ``torch.optim``'s ``_single_tensor_*`` formulas) or one ``torch._foreach_*`` call per
  column (:data:`FOREACH`). Both are one class, :class:`InPlace`, over a kernel table.

Naming: an operation ending in ``_`` *updates* its first argument (a state buffer, or a
temporary the step owns): the in-place interpreters overwrite it and return it, the
functional one returns a new column; a step always uses the returned value, so it reads
the same under both. Other operations return new tensors in both. The ``step*``
operations move the parameters, ``θ ← θ − lr·Δ − η·wd·θ`` (``decay = (η, wd)``: decoupled
weight decay, Loshchilov & Hutter, ICLR 2019): the functional interpreter returns the
updates (:func:`mloc.runtime.optim.base.apply_updates` adds them), the in-place ones
write ``θ`` and return ``None``.

Each operation maps to one fixed kernel per interpreter, and the functional kernels
compute their scalars per tensor (``-lr * d``, ``1 - b``), so that autograd sums the
same terms in the same order: each form of an optimizer keeps the bits it is pinned to
(``update``: the unrolled examples' checkpoints; ``commit``: ``torch.optim``). The two forms of one operation compute the same
floating-point expression for the operations in :data:`EXACT`; the others round
differently, because the in-place kernel fuses a product into its sum (``add(alpha=)``,
``lerp``, ``addcmul`` without a value, ``addcdiv`` after a decay) or because the two forms
take different routes to the same number (``bias_root``, ``div_bias``, ``step_nesterov``:
each says which). ``tests/runtime/test_optim_ops.py`` checks both statements.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

Column = Sequence[Tensor]

EXACT = frozenset({"div", "sqrt", "safe_sqrt", "copy", "add_", "ema_sq_", "rescale_"})
"""The operations whose functional and in-place kernels give the same bits (on the CPU);
the others agree to a few units in the last place."""


def safe_sqrt(v: Tensor) -> Tensor:
    """``√v``, the same numbers, with derivative 0 instead of ``∞`` where ``v`` is 0 (an
    entry whose gradient has been exactly 0 so far, e.g. a dead unit's: ``∞·0`` would make
    an ``itd`` hypergradient NaN). The derivative of ``g/(√v + δ)`` there is then ``1/δ``,
    that of the function as written."""
    positive = v > 0
    return torch.where(positive, torch.where(positive, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


class Functional:
    """Out of place and differentiable; hyperparameters may be tensors. Every operation
    returns new tensors (a column as a list); the ``step*`` operations return the updates."""

    inplace = False

    # --- new values ----------------------------------------------------------------------
    @staticmethod
    def add(x: Column, y: Column, a) -> list:
        """``x + a·y``. Rounds: in place, ``add(y, alpha=a)`` (one fused multiply-add)."""
        return [xi + a * yi for xi, yi in zip(x, y)]

    @staticmethod
    def div(x: Column, y) -> list:
        """``x / y`` (``y`` a column or a number)."""
        if isinstance(y, (list, tuple)):
            return [xi / yi for xi, yi in zip(x, y)]
        return [xi / y for xi in x]

    @staticmethod
    def sqrt(x: Column) -> list:
        """``√x``."""
        return [torch.sqrt(xi) for xi in x]

    @staticmethod
    def safe_sqrt(x: Column) -> list:
        """``√x`` whose derivative is 0 where ``x`` is 0 (:func:`safe_sqrt`)."""
        return [safe_sqrt(xi) for xi in x]

    @staticmethod
    def copy(x: Column) -> list:
        """``x`` as a buffer the state owns (functionally: ``x`` itself)."""
        return list(x)

    @staticmethod
    def bias_root(v: Column, c, root=None) -> list:
        """``√(v/c)`` (an Adam bias-corrected root), derivative 0 where ``v`` is 0.
        Rounds: divided, then rooted (in place: rooted, then divided by ``√c``, or by
        ``root`` where the caller has it: a number computed on the host)."""
        return [safe_sqrt(vi / c) for vi in v]

    @staticmethod
    def div_bias(m: Column, d: Column, c) -> list:
        """``(m/c)/d``. Rounds: the in-place form divides by ``d`` first."""
        return [mi / c / di for mi, di in zip(m, d)]

    # --- updates of buffers the step owns --------------------------------------------------
    @staticmethod
    def add_(x: Column, c) -> list:
        """``x + c`` (``c`` a number)."""
        return [xi + c for xi in x]

    @staticmethod
    def ema_(x: Column, y: Column, b) -> list:
        """``b·x + (1−b)·y``, as written. Rounds: in place, ``lerp(x, y, 1−b)``."""
        return [b * xi + (1 - b) * yi for xi, yi in zip(x, y)]

    @staticmethod
    def ema_lerp_(x: Column, y: Column, b) -> list:
        """``b·x + (1−b)·y`` as ``x + (1−b)·(y − x)``. Rounds: in place, ``lerp``."""
        return [xi + (1 - b) * (yi - xi) for xi, yi in zip(x, y)]

    @staticmethod
    def momentum_(x: Column, y: Column, mu, damp) -> list:
        """``μ·x + (1−damp)·y``. Rounds: in place, ``x·μ`` then ``add(y, alpha=1−damp)``."""
        return [mu * xi + (1 - damp) * yi for xi, yi in zip(x, y)]

    @staticmethod
    def ema_sq_(v: Column, g: Column, b) -> list:
        """``b·v + (1−b)·g²`` (in place: ``v·b``, then ``addcmul(g, g, value=1−b)``)."""
        return [b * vi + (1 - b) * gi * gi for vi, gi in zip(v, g)]

    @staticmethod
    def add_sq_(v: Column, g: Column) -> list:
        """``v + g²``. Rounds: in place, ``addcmul(g, g)``."""
        return [vi + gi * gi for vi, gi in zip(v, g)]

    @staticmethod
    def rescale_(x: Column, y: Column, eps: float) -> list:
        """``x·‖y‖/(‖x‖ + eps)`` per tensor (a grafted norm)."""
        return [xi * (_norm(yi) / (_norm(xi) + eps)) for xi, yi in zip(x, y)]

    # --- the parameters --------------------------------------------------------------------
    @staticmethod
    def step(p: Column, d: Column, lr, decay=None) -> tuple:
        """The updates of ``θ ← θ − lr·d − η·wd·θ``, ``decay = (η, wd)`` (None: no decay).
        Rounds: in place, ``θ·(1 − η·wd)``, then ``add(d, alpha=−lr)``."""
        return _decayed(tuple(-lr * di for di in d), p, decay)

    @staticmethod
    def step_div(p: Column, m: Column, d: Column, lr, decay=None) -> tuple:
        """The updates of ``θ ← θ − lr·m/d − η·wd·θ``. Rounds: in place, ``θ·(1 − η·wd)``,
        then ``addcdiv(m, d, value=−lr)``."""
        return _decayed(tuple(-lr * mi / di for mi, di in zip(m, d)), p, decay)

    @staticmethod
    def step_nesterov(p: Column, d: Column, b: Column, b_new: Column, mu, lr, decay=None) -> tuple:
        """The updates of ``θ ← θ − lr·(d + μ·b_new) − η·wd·θ``, ``b_new = μ·b + d`` (``b``
        is unused here). Rounds: in place, ``θ − lr(1+μ)·b_new + lrμ·b``."""
        return _decayed(tuple(-lr * (di + mu * bi) for di, bi in zip(d, b_new)), p, decay)


def _decayed(updates: tuple, p: Column, decay) -> tuple:
    if decay is None:
        return updates
    lr, wd = decay
    return tuple(u - lr * wd * pi for u, pi in zip(updates, p))


def _norm(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x)


class InPlace:
    """The training step (no autograd; hyperparameters are numbers): buffers are
    overwritten, the parameters written. ``k`` is the kernel table: :class:`Tensorwise`
    (a Python loop of ``torch.optim``'s single-tensor kernels) or :class:`Foreach`
    (``torch._foreach_*``); the operations mean what :class:`Functional`'s say."""

    inplace = True

    def __init__(self, kernels: Any):
        self.k = kernels
        # the operations that are one kernel, bound to it (no call in between)
        self.add, self.div, self.add_, self.rescale_ = kernels.add, kernels.div, kernels.add_, kernels.rescale_
        self.sqrt = self.safe_sqrt = kernels.sqrt

    @staticmethod
    def copy(x):
        return [xi.detach().clone() for xi in x]

    def bias_root(self, v, c, root=None):
        return self.k.div_(self.k.sqrt(v), c ** 0.5 if root is None else root)

    def div_bias(self, m, d, c):
        return self.k.div_(self.k.div(m, d), c)

    def ema_(self, x, y, b):
        return self.k.lerp_(x, y, 1 - b)

    ema_lerp_ = ema_

    def momentum_(self, x, y, mu, damp):
        return self.k.add_col_(self.k.mul_(x, mu), y, 1 - damp)

    def ema_sq_(self, v, g, b):
        return self.k.addcmul_(self.k.mul_(v, b), g, g, 1 - b)

    def add_sq_(self, v, g):
        return self.k.addcmul_(v, g, g, None)

    def step(self, p, d, lr, decay=None):
        self._decay(p, decay)
        self.k.add_col_(p, d, -lr)

    def step_div(self, p, m, d, lr, decay=None):
        self._decay(p, decay)
        self.k.addcdiv_(p, m, d, -lr)

    def step_nesterov(self, p, d, b, b_new, mu, lr, decay=None):
        self._decay(p, decay)
        self.k.add_col_(p, b_new, -lr * (1 + mu))
        self.k.add_col_(p, b, lr * mu)

    def _decay(self, p, decay):
        if decay is not None:
            lr, wd = decay
            self.k.mul_(p, 1 - lr * wd)


def _each(kernel):
    """``x ← kernel(x, c)`` for every tensor of the column ``x`` (``c`` a number)."""
    def apply(x, c):
        for xi in x:
            kernel(xi, c)
        return x
    return apply


class Tensorwise:
    """:class:`InPlace`'s kernels as ``torch.optim``'s ``_single_tensor_*`` formulas call
    them: one kernel per tensor."""

    @staticmethod
    def add(x, y, a):
        return [xi.add(yi, alpha=a) for xi, yi in zip(x, y)]

    div = staticmethod(Functional.div)      # ``/``: the same kernel out of place

    @staticmethod
    def sqrt(x):
        return [xi.sqrt() for xi in x]

    div_ = staticmethod(_each(Tensor.div_))
    add_ = staticmethod(_each(Tensor.add_))
    mul_ = staticmethod(_each(Tensor.mul_))

    @staticmethod
    def add_col_(x, y, a):
        for xi, yi in zip(x, y):
            xi.add_(yi, alpha=a)
        return x

    @staticmethod
    def lerp_(x, y, w):
        for xi, yi in zip(x, y):
            xi.lerp_(yi, w)
        return x

    @staticmethod
    def addcmul_(x, y, z, c):
        for xi, yi, zi in zip(x, y, z):
            if c is None:
                xi.addcmul_(yi, zi)
            else:
                xi.addcmul_(yi, zi, value=c)
        return x

    @staticmethod
    def addcdiv_(x, y, z, c):
        for xi, yi, zi in zip(x, y, z):
            xi.addcdiv_(yi, zi, value=c)
        return x

    @staticmethod
    def rescale_(x, y, eps):
        for xi, yi in zip(x, y):
            xi.mul_(_norm(yi) / (_norm(xi) + eps))
        return x


class Foreach:
    """:class:`InPlace`'s kernels as ``torch._foreach_*`` calls: one per column."""

    @staticmethod
    def add(x, y, a):
        return torch._foreach_add(list(x), list(y), alpha=a)

    @staticmethod
    def div(x, y):
        return torch._foreach_div(list(x), list(y) if isinstance(y, (list, tuple)) else y)

    @staticmethod
    def sqrt(x):
        return torch._foreach_sqrt(list(x))

    @staticmethod
    def div_(x, c):
        torch._foreach_div_(x, c)
        return x

    @staticmethod
    def add_(x, c):
        torch._foreach_add_(x, c)
        return x

    @staticmethod
    def mul_(x, c):
        torch._foreach_mul_(x, c)
        return x

    @staticmethod
    def add_col_(x, y, a):
        torch._foreach_add_(x, list(y), alpha=a)
        return x

    @staticmethod
    def lerp_(x, y, w):
        torch._foreach_lerp_(x, list(y), w)
        return x

    @staticmethod
    def addcmul_(x, y, z, c):
        if c is None:
            torch._foreach_addcmul_(x, list(y), list(z))
        else:
            torch._foreach_addcmul_(x, list(y), list(z), value=c)
        return x

    @staticmethod
    def addcdiv_(x, y, z, c):
        torch._foreach_addcdiv_(x, list(y), list(z), value=c)
        return x

    @staticmethod
    def rescale_(x, y, eps):
        """One norm call for ``x`` and ``y`` together, ``‖x‖ + eps``, then the ratios."""
        if not x:
            return x
        norms = torch._foreach_norm(list(x) + list(y))
        x_norms = torch._foreach_add(norms[:len(x)], eps)
        torch._foreach_mul_(x, torch._foreach_div(norms[len(x):], x_norms))
        return x


FUNCTIONAL = Functional()
INPLACE = InPlace(Tensorwise)
FOREACH = InPlace(Foreach)
