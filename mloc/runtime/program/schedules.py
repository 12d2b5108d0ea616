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


class ScheduleError(ValueError):
    """A schedule mloc cannot drive: a scheduler whose ``step`` reads a metric, one that
    cannot be built or stepped on this problem's optimizer, or one that changes a
    setting the optimizer cannot take. ``help`` says what to change (E710)."""

    def __init__(self, message: str, help: str):
        super().__init__(message)
        self.help = help


class TorchSchedule:
    r"""A ``torch.optim.lr_scheduler`` class (or a factory ``f(optimizer, **options)``
    returning a scheduler; ``cls`` as ``"module:attr"``) driven by the step count.

    The scheduler steps a stand-in optimizer whose rate starts at ``base`` (so absolute
    rates such as ``eta_min`` or ``max_lr`` mean what they say), lazily as far as asked;
    every value is remembered. After ``k`` stand-in steps the stand-in's param group holds
    what a hand-written loop with ``scheduler.step()`` after each ``optimizer.step()``
    uses for its step ``k``. Calling the schedule gives ``factor(k)``, that rate over
    ``base``. Built alone, the stand-in is a plain SGD (the rate needs no more; this also
    refuses, when the program is built, a scheduler whose ``step`` needs a metric, such as
    ``ReduceLROnPlateau``, and a scheduler's bad arguments).

    :meth:`bind` re-creates the scheduler on a stand-in of the problem's real optimizer
    (its class, for a ``torch.optim`` one; else its hyperparameters under torch's keys) and
    says which other entries of the param group the scheduler drives: those it sets when
    built (OneCycleLR and CyclicLR overwrite the momentum at once), and the momentum
    (``betas[0]`` when the group has ``betas``, else ``momentum``) of a scheduler with
    ``cycle_momentum`` set, torch's attribute for "cycles it at every step". Their values
    at step ``k`` are :meth:`values`; an entry of the optimizer's own that the scheduler
    changes later, which nothing was prepared to apply, is a :class:`ScheduleError` at that
    step rather than a change silently dropped.
    """

    def __init__(self, cls, options=None, base: float = 1.0, group: dict | None = None, optimizer=None,
                 label: str | None = None, every: bool = False):
        from mloc.runtime.optim.torch_optim import load_ref

        self.ref, self.options, self.base = cls, dict(options or {}), base
        self.label = label
        self.factory = load_ref(cls)
        self.name = getattr(self.factory, "__name__", str(cls))
        if optimizer is None:
            import torch
            optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
            group = {"lr": base}
        self.optimizer = optimizer
        self.scheduler = self._build(optimizer)
        self.declared = {k: group[k] for k in group if k != "lr"} if group is not None else {}
        first = optimizer.param_groups[0]
        self.cycles_momentum = bool(getattr(self.scheduler, "cycle_momentum", False))
        self.momentum_key = "betas" if getattr(self.scheduler, "use_beta1", False) else "momentum"
        momentum = self.momentum_key if self.cycles_momentum else None
        self.keys = ("lr",) * every + tuple(k for k in self.declared
                                            if every or k == momentum or _differs(first[k], self.declared[k]))
        self._rates = [first["lr"]]
        self._values = [tuple(first[k] for k in self.keys)]

    def _build(self, optimizer):
        import inspect

        described = f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"
        try:
            scheduler = self.factory(optimizer, **self.options)
        except (TypeError, ValueError, KeyError) as e:
            raise ScheduleError(f"{described} cannot " + (f"schedule {self.label}: {e}" if self.label else
                                                           f"be built: {e}"),
                                _fix(str(e))) from None
        needs = [p.name for p in inspect.signature(scheduler.step).parameters.values()
                 if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        if needs:
            raise ScheduleError(f"{type(scheduler).__name__}.step() needs {', '.join(needs)}: a schedule that "
                                "reads a metric cannot be driven by the step count alone",
                                "use a schedule of the step count (e.g. "
                                "torch.optim.lr_scheduler.CosineAnnealingLR(T_max=...)), or drop the schedule")
        return scheduler

    def bind(self, optimizer, label: str | None = None, every: bool = False) -> "TorchSchedule":
        """The same schedule re-created on ``optimizer``, a stand-in of the problem's real
        optimizer (:meth:`mloc.runtime.optim.Optimizer.schedule_stand_in`); ``label`` names
        that optimizer in messages. ``every``: drive every entry of the group, whenever it
        changes, the rate too (an optimizer that takes any entry at any step: a
        ``torch.optim`` one, which then steps with the scheduler's own rate, not
        ``base · factor``)."""
        group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        return TorchSchedule(self.ref, self.options, self.base, group, optimizer, label, every)

    def _advance(self, step: int) -> None:
        group = self.optimizer.param_groups[0]
        while len(self._rates) <= step:
            k = len(self._rates)
            self.optimizer.step()
            try:
                self.scheduler.step()
            except (ValueError, IndexError, ZeroDivisionError) as e:
                raise ScheduleError(f"{self.name} cannot give the problem's step {k + 1}: {e}",
                                    _fix(str(e))) from None
            for key, declared in self.declared.items():
                if key not in self.keys and _differs(group[key], declared):
                    raise ScheduleError(
                        f"{self.name} changes `{key}` of {self.label or 'the optimizer'} at the problem's step {k + 1} "
                        f"({declared!r} -> {group[key]!r}): mloc applies what a scheduler sets when it is "
                        "built and the momentum it cycles, not a setting it starts changing later",
                        "write the scheduler so that it sets the value when it is built, or use "
                        "a torch.optim optimizer")
            self._rates.append(group["lr"])
            self._values.append(tuple(group[k] for k in self.keys))

    def __call__(self, step: int) -> float:
        self._advance(step)
        return self._rates[step] / self.base

    def values(self, step: int) -> dict:
        """The driven entries of the param group (:attr:`keys`) at step ``step``."""
        self._advance(step)
        return dict(zip(self.keys, self._values[step]))


def _differs(a, b) -> bool:
    try:
        return bool(a != b)
    except (RuntimeError, TypeError):     # a tensor entry
        return a is not b


def _fix(message: str) -> str:
    """The help for a scheduler that torch refused to build or step."""
    if "cycle_momentum" in message:
        return ("pass `cycle_momentum=false` to the scheduler (this optimizer has neither `momentum` nor "
                "`betas` to cycle), or use an optimizer that has one")
    if "total" in message or "Tried to step" in message:
        return "make the schedule span the whole run (e.g. `total_steps` = the problem's steps in the run)"
    return "check the scheduler's arguments against its documentation"


def torch_schedule(cls=None, options=None, base: float = 1.0) -> "TorchSchedule | Callable[[int], float]":
    """The schedule of a ``torch.optim.lr_scheduler`` class or factory (:class:`TorchSchedule`);
    None: the constant rate."""
    if cls is None:
        return constant()
    return TorchSchedule(cls, options, base)


def bind(schedule, optimizer, lr: float, label: str):
    """``schedule`` as the problem's ``optimizer`` (an :class:`mloc.runtime.optim.Optimizer`
    with learning rate ``lr``, named ``label`` in messages) takes it: a
    :class:`TorchSchedule` re-created on the optimizer's stand-in, its driven entries
    checked against those the optimizer can take (:meth:`~mloc.runtime.optim.Optimizer.drives`);
    any other schedule as it is. The one check the trace pass (E710 at the schedule, before
    training) and the build both run."""
    if not isinstance(schedule, TorchSchedule):
        return schedule
    bound = schedule.bind(optimizer.schedule_stand_in(lr), label, every=optimizer.drives("*"))
    refused = [k for k in bound.keys if not optimizer.drives(k)]
    if refused:
        values = ", ".join(f"`{k}` ({bound.declared[k]!r} -> {bound.values(0)[k]!r} at step 1)" for k in refused)
        raise ScheduleError(f"{bound.name} changes {values} of {label}, which mloc cannot apply to it",
                            "pass `cycle_momentum=false` to the scheduler" if bound.cycles_momentum
                            and refused == [bound.momentum_key] else
                            "schedule only what the optimizer takes, or use a torch.optim optimizer")
    return bound


def starts_momentum(bound) -> str | None:
    """For a bound :class:`TorchSchedule` that cycles a momentum the optimizer declared 0
    (``momentum``, or ``betas[0]``): the range it cycles, ``"0.85–0.95"`` (W107); else None."""
    if not isinstance(bound, TorchSchedule) or not bound.cycles_momentum:
        return None
    declared = bound.declared.get(bound.momentum_key)
    first = declared[0] if isinstance(declared, (tuple, list)) else declared
    if first != 0:
        return None
    group = bound.optimizer.param_groups[0]
    return f"{group.get('base_momentum', '?')}–{group.get('max_momentum', '?')}"
