"""Learning-rate schedules: each factory returns ``factor(step) -> float``, the multiple of
the optimizer's base learning rate used for the problem's ``step``-th commit (0-based).

The engine calls ``factor`` once per commit and writes ``base · factor`` into the
optimizer's learning-rate tensor, so a schedule never retraces or rebuilds the optimizer.
"""

from __future__ import annotations

import math
from bisect import bisect_right
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



def multistep(milestones, gamma: float = 0.1) -> Callable[[int], float]:
    """``gamma`` to the number of milestones at or below ``step``: torch's ``MultiStepLR``
    (which multiplies its rate by ``gamma`` at each milestone: the same rates, up to the
    rounding of ``base·γ·γ`` against ``base·γ²``)."""
    ms = sorted(milestones)
    return lambda step: gamma ** bisect_right(ms, step)


def torch_schedule(cls=None, options=None, base: float = 1.0) -> Callable[[int], float]:
    """The factor a ``torch.optim.lr_scheduler`` class (or a factory ``f(optimizer,
    **options)`` returning a scheduler; ``cls`` as ``"module:attr"``) gives at each step:
    the scheduler drives a stand-in SGD optimizer whose rate starts at ``base`` (so absolute
    rates such as ``eta_min`` or ``max_lr`` mean what they say), stepped lazily as far as
    asked and remembered; ``factor(k)`` is its rate after ``k`` steps over ``base``. The
    rate after ``k`` steps is the one a hand-written loop with ``scheduler.step()`` after
    each ``optimizer.step()`` uses for its step ``k``. None: the constant rate. A scheduler
    whose ``step`` needs a metric (``ReduceLROnPlateau``) is refused."""
    if cls is None:
        return constant()
    import inspect

    import torch

    from mloc.runtime.optim.torch_optim import load_ref

    factory = load_ref(cls)
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    scheduler = factory(stand_in, **dict(options or {}))
    needs = [p.name for p in inspect.signature(scheduler.step).parameters.values()
             if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    if needs:
        raise ValueError(f"{type(scheduler).__name__}.step() needs {', '.join(needs)}: a schedule "
                         "that reads a metric cannot be driven by the step count alone")
    rates = [stand_in.param_groups[0]["lr"]]

    def factor(step: int) -> float:
        while len(rates) <= step:
            stand_in.step()
            scheduler.step()
            rates.append(stand_in.param_groups[0]["lr"])
        return rates[step] / base
    return factor
