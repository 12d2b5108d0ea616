r"""A step whose compiled graph also runs the optimizer's update (a *fused* step).

A plain compiled step (:class:`~mloc.runtime.compiled.step.CompiledSource`) captures the
gradient source, and the optimizer's commit runs after it as a second compiled region.
:class:`FusedStep` captures both as one graph: for a problem with parameters ``θ``,
optimizer state ``s`` and hyperparameters ``h`` (a scheduled rate is a 0-dim tensor),

.. math::
    (g, \ell) = \text{source}(\theta, \text{batch}),\qquad
    (u, s') = \text{update}(g, s, \theta; h),\qquad \theta \leftarrow \theta + u,\quad
    s \leftarrow s'

with :meth:`Optimizer.update <mloc.runtime.optim.base.Optimizer.update>`, the pure
functional update (optax's form, the one an unroll differentiates), so that Inductor fuses
the update's elementwise work into the kernels around the gradient's last matrix products
and no second graph is entered per step. The step count of the state is *lifted* into a
0-dim float64 input (:mod:`~mloc.runtime.compiled.step`): Adam's ``1 − β₁ᵗ`` is computed in
the graph from it, SGD's ``if count == 0`` is a guard (a second graph for the steps after the
first), never a constant baked into a graph.

The parameters and every state tensor whose new value has the old one's layout are
written in place by the graph (``p.add_(u)``, ``m.copy_(m')``: TorchInductor turns a
mutated input into a store into that buffer); a state tensor without such a partner (a
new buffer) is an output. The state's numbers after the step (``count + 1``) are
computed on the host from the lifted numbers' values, so the state keeps the eager
commit's layout (a Python int count) and a checkpoint written by either is read by the other.

What stays outside the graph, in the pipeline's order (:class:`~mloc.runtime.grad.commit.Fusion`):
the schedule, before it (it writes the rate the graph reads); after it, the finite
watches on the loss or hypergradient and on everything committed (queued flags, read at
the next log step or checkpoint, as in eager: a non-finite gradient is named and no
checkpoint is written after it), ``project``, the step counter. A stage that acts between
the gradient and the update (the all-reduce of data parallelism, fp16 unscaling,
``clip_grad_norm``) keeps them apart, as does an optimizer whose step cannot be captured
(``Optimizer.unfused``: ``torch.optim``'s ``step()``, Shampoo's async roots); the step's
report says why. An optimizer with host work on some steps only (``Optimizer.host_work``:
Shampoo's root refreshes and installs) runs :meth:`Optimizer.fused_update
<mloc.runtime.optim.base.Optimizer.fused_update>` (the update without that work) in the
graph on the other steps; on those, the step runs the source's graph alone (a second
graph of the same step, with the same inputs) and the optimizer's compiled commit after
it, and the report says so (``apart``). A parameter no gradient reached (whose state ``torch.optim`` leaves
alone) keeps the update apart: the graph is the source's, and the commit runs after it,
compiled apart (:data:`ABSENT`, in the report). Anything that refuses a plain capture
refuses this one; the step then runs eagerly: the source, then the optimizer's commit.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from mloc.runtime.base import tree
from mloc.runtime.compiled.step import CompiledSource, StepReport, _Number, _numbers_of, _rebuild_like


class _Slot:
    """A tensor of the new state in a captured step's template: the old state's
    ``k``-th tensor (written in place: ``old``) or the graph's ``k``-th extra output."""

    __slots__ = ("old", "k")

    def __init__(self, old: bool, k: int):
        self.old, self.k = old, k


def _resolve(template: Any, leaf: Callable[[Any], Any]) -> Any:
    """``template`` with ``leaf`` applied to its :class:`_Slot` and :class:`_Number` leaves."""
    if isinstance(template, (_Slot, _Number)):
        return leaf(template)
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_resolve(v, leaf) for v in template))
    if isinstance(template, (tuple, list)):
        return type(template)(_resolve(v, leaf) for v in template)
    if isinstance(template, dict):
        return {k: _resolve(v, leaf) for k, v in template.items()}
    return template


def _into(old: Any, new: Any) -> Any:
    """``new`` (a state) with its tensors written into ``old``'s, where the two states'
    tensors pair up in order with the same layout (then ``new`` holds ``old``'s
    tensors); else ``new`` as it is."""
    olds, news = tree.tensors(old), tree.tensors(new)
    where = {id(a): i for i, a in enumerate(olds)}
    if len(olds) != len(news) or any(
            a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or where.get(id(b), i) != i
            for i, (a, b) in enumerate(zip(olds, news))):
        return new
    for a, b in zip(olds, news):
        if a is not b:
            a.copy_(b)
    return tree.replace_tensors(new, olds)


ABSENT = ("a parameter no gradient reached keeps its optimizer state as it was (as torch.optim skips a .grad "
          "of None), which the update in the graph does not model")
_APART = object()
"""What a captured step returns for the state when its graph holds the source alone (:data:`ABSENT`)."""


def _all_numbers(problems: Sequence[Any]) -> list:
    return [x for p in problems for x in _numbers_of(p.state)]


class FusedStep(CompiledSource):
    """The step of ``problem`` (see the module docstring): call it as a source
    (``step(seed) -> (grads, loss)``); it has committed the update when it returns, and
    ``fusion.after`` is what the pipeline still runs. ``lifted`` ends with ``problem``."""

    fused = True

    def __init__(self, source: Callable, fusion: Any, problem: Any, inputs: Callable[[], list[Tensor]],
                 numbers: Callable[[], tuple], report: StepReport, lifted: Sequence[Any]):
        super().__init__(self._body, inputs, numbers, report, lifted, outputs=(self._flatten, self._rebuild_like))
        self.raw, self.fusion, self.problem = source, fusion, problem
        self.capturing = False
        self._old: frozenset = frozenset()      # ids of the state's tensors during a capture
        report.fused = True
        # the source's graph alone, for a step whose commit does host work (Optimizer.host_work)
        self.plain = CompiledSource(source, inputs, numbers, report, lifted[:-1])

    def __call__(self, seed=None):
        self.fusion.schedule()
        old = self.problem.state
        if self.problem.optimizer.host_work(old):     # this step's commit after its graph, compiled apart
            self.report.apart = self.problem.optimizer.apart
            grads, loss = self.plain(seed)
            self.fusion.commit(grads)
            return grads, loss
        grads, loss, finish = super().__call__(seed)
        if finish is _APART:
            self.fusion.commit(grads)
        elif finish is not None:
            self.problem.state = finish(old, _all_numbers(self.lifted))
        return grads, loss

    def _build(self, inputs: list[Tensor], numbers: list):
        self.capturing = True
        try:
            return super()._build(inputs, numbers)
        finally:
            self.capturing = False

    def _body(self, seed):
        """The step: captured, the source and the functional update written in place;
        otherwise (the eager fallback) the source, then the optimizer's commit."""
        if not self.capturing:
            grads, loss = self.raw(seed)
            self.fusion.commit(grads)
            return grads, loss, None
        grads, loss = self.raw(None)
        if tree.absent(grads):      # the graph is the source's alone; the commit runs after it
            self.report.fused, self.report.split = False, ABSENT
            return grads, loss, None
        problem = self.problem
        state, params = problem.state, problem.params
        self._old = frozenset(map(id, tree.tensors(state)))
        with torch.no_grad():
            updates, new = problem.optimizer.fused_update(grads, state, params)
            for p, u in zip(params, updates):
                p.add_(u)
            new = _into(state, new)
        return grads, loss, new

    def _flatten(self, result) -> tuple[Tensor, ...]:
        grads, loss, new = result
        extra = tuple(t for t in tree.tensors(new) if id(t) not in self._old)
        return (*grads, *((loss,) if loss is not None else ()), *extra)

    def _rebuild_like(self, result):
        grads, loss, new = result
        n, head = len(grads) + (loss is not None), _rebuild_like((grads, loss))
        if new is None:
            return lambda flat: (*head(flat), _APART)
        olds = {id(t): k for k, t in enumerate(tree.tensors(self.problem.state))}
        extra = iter(range(len(tree.tensors(new))))
        template = tree.map_tensors(new, lambda t: _Slot(True, olds[id(t)]) if id(t) in olds
                                    else _Slot(False, next(extra)))

        def rebuild(flat: Sequence[Tensor]):
            grads, loss = head(flat[:n])
            out = flat[n:]

            def finish(old: Any, numbers: list) -> Any:
                kept = tree.tensors(old)
                return _resolve(template, lambda x: (kept[x.k] if x.old else out[x.k]) if isinstance(x, _Slot)
                                else x.derive(numbers[x.index]))
            return grads, loss, finish
        return rebuild
