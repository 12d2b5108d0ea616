"""Learning-rate schedules: each factory returns ``factor(step) -> float``, the multiple of
the optimizer's base learning rate used for the problem's ``step``-th commit (0-based).

The engine calls ``factor`` once per commit and writes ``base · factor`` into the
optimizer's learning-rate tensor, so a schedule never retraces or rebuilds the optimizer.
"""

from __future__ import annotations

import math
from typing import Callable


def cosine(total: int, warmup: int = 0, min_lr: float = 0.0, base: float = 1.0) -> Callable[[int], float]:
    """Learning-rate factor: linear warm-up over `warmup` steps, then cosine to `min_lr`/base."""
    floor = min_lr / base if base else 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    return factor


def linear(total: int, warmup: int = 0) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, 1 - (step - warmup) / max(1, total - warmup))
    return factor


def step_decay(every: int, gamma: float = 0.1) -> Callable[[int], float]:
    return lambda step: gamma ** (step // every)


def exponential(gamma: float) -> Callable[[int], float]:
    return lambda step: gamma ** step


def constant() -> Callable[[int], float]:
    return lambda step: 1.0

