"""What an evaluation may return, and the error when it returns something else.

An evaluation (`eval every N = lib.fn(...)`) returns a number, a 0-dim tensor, or a dict of
them keyed by strings (each key becomes a metric of its own). Anything else is the program's
mistake: :class:`EvaluationError`, reported like an error raised by the program's code
(E702), at the line of `train.py` that calls it, which names the `.mlo` line.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Callable

import torch


class EvaluationError(TypeError):
    """An evaluation returned a value that is not a metric; ``frames`` locate the call."""

    def __init__(self, message: str, frames: list[str]):
        super().__init__(message)
        self.frames = frames


def metrics(label: str, fn: Callable, value) -> dict[str, float]:
    """``value`` (what evaluation ``label``, the function ``fn``, returned) as metrics."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _error(label, fn, f"a dict with a key of type {type(key).__name__}")
            out[key] = _number(label, fn, item, f" under key {key!r}")
        return out
    return {label: _number(label, fn, value, "")}


def _number(label: str, fn: Callable, value, where: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not value.is_complex():
            return float(value)
        raise _error(label, fn, f"a tensor of shape {list(value.shape)}{where}")
    if isinstance(value, numbers.Real):
        return float(value)
    raise _error(label, fn, f"a {type(value).__name__}{where}")


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
