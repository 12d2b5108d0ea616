"""Module buffers (BatchNorm statistics) change only in their own problem's training steps.

The rule, for a program whose modules have buffers: a training step of problem ``P``
updates the buffers of ``P``'s module by the forwards of ``P``'s own loss, and nothing else
changes a buffer.

- A lower step of ``P``: its one forward updates ``P``'s buffers; the modules of the other
  problems its loss reads (Meta-Weight-Net's weight net in a classifier step) keep theirs.
- An upper step of ``P``: the first forward of ``P``'s own loss (the seed of its
  hypergradient) updates ``P``'s buffers. Every other forward of the hypergradient, the
  upper loss through the lower problems, perturbed and Hessian-vector evaluations, ``itd``'s
  unrolled steps (the ``lower_step``s that commit them afterwards are the lower's own steps
  and do update its buffers), leaves every buffer bit-identical.
- ``losses()``, evaluations and ``hypergradients()`` change no buffer.

In training mode a BatchNorm layer normalizes with the batch's statistics, so restoring
the running statistics changes no number of the step itself, only what later
evaluation-mode forwards read. Programs without buffers pay nothing: no guard is built.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn


def buffers_of(modules: Iterable[nn.Module], exclude: Sequence[Tensor] = ()) -> tuple[Tensor, ...]:
    """The buffers of ``modules`` (each tensor once), less those in ``exclude``."""
    skip = {id(t) for t in exclude}
    out: dict[int, Tensor] = {}
    for module in modules:
        for t in module.buffers():
            if id(t) not in skip:
                out.setdefault(id(t), t)
    return tuple(out.values())


def _restore(tensors: Sequence[Tensor], saved: Sequence[Tensor]) -> None:
    with torch.no_grad():
        for t, s in zip(tensors, saved):
            t.copy_(s)


@contextmanager
def frozen(tensors: Sequence[Tensor]) -> Iterator[None]:
    """Whatever runs inside, ``tensors`` end bit-identical to what they were (on error too)."""
    saved = [t.clone() for t in tensors]
    try:
        yield
    finally:
        _restore(tensors, saved)


class OwnForward:
    """Isolates the first forward of an upper's own loss within its step (the loss's
    ``watch``): before it, the problem's buffers go back to where the step started (undoing
    what other forwards did to them so far); after it, they are kept as the final value.

    The reset before it happens while earlier forwards' graphs are alive, which may have
    saved the buffers (BatchNorm saves its running statistics, but its training-mode
    backward reads the batch statistics instead): it writes through ``.data``, which leaves
    autograd's version counters alone."""

    def __init__(self, own: Sequence[Tensor]):
        self.own, self.start, self.kept = own, None, None

    def begin(self) -> None:
        self.start, self.kept = [t.clone() for t in self.own], None

    def before(self) -> None:
        if self.kept is None:   # mid-step: through `.data`, so no autograd version changes
            for t, s in zip(self.own, self.start):
                t.data.copy_(s)

    def after(self) -> None:
        if self.kept is None:
            self.kept = [t.clone() for t in self.own]

    def end(self) -> None:
        _restore(self.own, self.start if self.kept is None else self.kept)
        self.start = self.kept = None


def guard_step(fn: Callable, others: Sequence[Tensor], own: Sequence[Tensor] = (),
               own_loss=None) -> Callable:
    """``fn`` (one step's gradient computation) with the rule applied: ``others`` restored
    after it; ``own`` (the stepped problem's buffers, for an upper step) left as the first
    forward of ``own_loss`` (its loss, a :class:`~mloc.runtime.program.binding.BoundLoss`) alone
    would leave them (:class:`OwnForward`), or restored when the step never evaluates it.
    ``fn`` itself when there is nothing to guard."""
    if not others and not own:
        return fn
    if not own:
        def guarded(*args):
            with frozen(others):
                return fn(*args)
        return guarded
    watch = OwnForward(own)

    def guarded_own(*args):
        watch.begin()
        own_loss.watch = watch
        try:
            with frozen(others):
                return fn(*args)
        finally:
            own_loss.watch = None
            watch.end()
    return guarded_own


@contextmanager
def inference(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Evaluation mode for every submodule of ``modules``, no autograd, buffers unchanged;
    each submodule's previous mode restored after (on error too)."""
    modules = list(modules)
    modes = [(m, m.training) for module in modules for m in module.modules()]
    with frozen(buffers_of(modules)):
        try:
            for module in modules:
                module.eval()
            with torch.no_grad():
                yield
        finally:
            for m, training in modes:
                m.training = training
