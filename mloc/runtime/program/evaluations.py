"""What an evaluation may return, and the error when it returns something else.

An evaluation (`eval every N = lib.fn(...)`) returns a number, a 0-dim tensor, or a dict of
them keyed by strings (each key becomes a metric of its own: `key`, or `NAME.key` for
an evaluation named `eval NAME every N = ...`). Anything else is the program's
mistake: :class:`EvaluationError`, reported like an error raised by the program's code
(E702), at the line of `train.py` that calls it, which names the `.mlo` line.
"""

from __future__ import annotations

import inspect
import numbers
import random
import sys
from typing import Callable, Iterable

import torch
from torch import nn

from mloc.runtime.grad.buffers import inference


class EvaluationError(TypeError):
    """An evaluation returned a value that is not a metric; ``frames`` locate the call."""

    def __init__(self, message: str, frames: list[str]):
        super().__init__(message)
        self.frames = frames


def metrics(label: str, fn: Callable, value, named: bool = False) -> dict[str, float]:
    """``value`` (what evaluation ``label``, the function ``fn``, returned) as metrics: a
    number under ``label``; a dict's entries under their keys, or under ``label.key`` when
    the evaluation is ``named`` (`eval acc every N = ...` returning {"top1": ...} gives
    ``acc.top1``). Anything else raises :class:`EvaluationError`."""
    wrong = invalid(value)
    if wrong is not None:
        raise _error(label, fn, wrong)
    return as_metrics(label, value, named)


def as_metrics(label: str, value, named: bool = False) -> dict[str, float]:
    """A valid value (``invalid(value) is None``) as {metric name: float}."""
    if isinstance(value, dict):
        return {f"{label}.{k}" if named else k: float(v) for k, v in value.items()}
    return {label: float(value)}


def invalid(value) -> str | None:
    """What is wrong with an evaluation's return value (``"a str"``, ``"a tensor of shape
    [3] under key 'top1'"``), or None when it is a metric or a dict of them."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a dict with a key of type {type(key).__name__}"
            wrong = _not_number(item)
            if wrong is not None:
                return f"{wrong} under key {key!r}"
        return None
    return _not_number(value)


def _not_number(value) -> str | None:
    if isinstance(value, torch.Tensor):
        return None if value.dim() == 0 and not value.is_complex() else f"a tensor of shape {list(value.shape)}"
    return None if isinstance(value, numbers.Real) else f"a {type(value).__name__}"


def _error(label: str, fn: Callable, what: str) -> EvaluationError:
    return EvaluationError(f"the evaluation `{label}` returned {what}; an evaluation returns a number, "
                           "a 0-dim tensor, or a dict of them keyed by name", _frames(fn))


def _frames(fn: Callable) -> list[str]:
    """`file:line in name: source` of the `return` line of the generated evaluation."""
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    for offset, line in enumerate(lines):
        if line.strip().startswith("return "):
            return [f"{fn.__code__.co_filename}:{start + offset} in {fn.__name__}: {line.strip()}"]
    return []


def trial(call: Callable[[], object], modules: Iterable[nn.Module]):
    """``call()`` as a run evaluates (:func:`~mloc.runtime.grad.buffers.inference` over
    ``modules``), with Python's, torch's CPU and (when imported) numpy's global random
    generators restored after: the compile-time trial of an evaluation changes nothing
    the run sees."""
    state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            with inference(modules):
                return call()
        finally:
            random.setstate(state)
            if np_state is not None:
                np.random.set_state(np_state)
