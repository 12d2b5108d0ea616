"""Gradient accumulation: k micro-steps, one optimizer step on their mean (`accumulate = k`).

A micro-step draws the problem's next batch and takes its gradient from the problem's
source (a plain gradient, or a hypergradient after its own lower solve: a meta-batch of
k tasks for MAML or iMAML); :meth:`Accumulator.apply` hands the mean,
``(1/k) Σᵢ gᵢ``, and the mean of the losses, to the problem's commit pipeline, as one step
on the concatenated batches would for a loss that is a mean over examples.
Under fp16 loss scaling every micro-step is seeded with the same scale (it changes only
when the pipeline commits), so the unscale stage divides the mean exactly as it would one
gradient.
"""

from __future__ import annotations

from typing import Callable

import torch

from mloc.runtime.grad.commit import Pipeline
from mloc.runtime.base.tree import absent, marked


class Accumulator:
    """The running sum of one problem's micro-step gradients (and losses)."""

    def __init__(self, draw: Callable[[], None], source: Callable, pipeline: Pipeline):
        self.draw, self.source, self.pipeline = draw, source, pipeline
        self.sum: list[torch.Tensor] | None = None
        self.absent: set[int] = set()     # parameters no micro-step's gradient reached
        self.losses: list[torch.Tensor] = []
        self.count = 0

    def add(self) -> None:
        """One micro-step: draw, gradient, add it to the sum."""
        self.draw()
        grads, loss = self.source(self.pipeline.seed)
        with torch.no_grad():
            if self.sum is None:
                self.sum = [g.detach().clone() for g in grads]
                self.absent = set(absent(grads))
            else:
                self.absent &= set(absent(grads))   # no gradient in any micro-step
                for s, g in zip(self.sum, grads):
                    s.add_(g)
        if loss is not None:
            self.losses.append(loss)
        self.count += 1

    def apply(self) -> None:
        """The optimizer step on the mean of the micro-steps since the last one."""
        if not self.count:
            raise RuntimeError("apply without an accumulated micro-step")
        with torch.no_grad():
            grads = marked([s.div_(self.count) for s in self.sum], sorted(self.absent))
            loss = torch.stack(self.losses).mean() if len(self.losses) == self.count else None
        self.sum, self.losses, self.count, self.absent = None, [], 0, set()
        self.pipeline.run(grads, loss)
