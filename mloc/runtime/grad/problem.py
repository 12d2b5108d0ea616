"""The runtime's problem abstraction and the linearization of one lower problem.

A :class:`Problem` is what generated code instantiates for each level: its parameters
(a tuple of leaf tensors, built once), a loss closure over the parameters of the problems
it ``reads`` (positional, in that order; the closure owns the data batch), and an
optimizer with its state. Nothing here knows the frontend's IR.

A :class:`LowerOp` is one lower problem frozen at the current point of a hypergradient
step: the arguments its loss reads, the cached gradient ``g = ∇_θ L`` (with graph, so the
Hessian-vector products ``Hp`` and the mixed product ``J_xᵀq`` are single backward
passes; Pearlmutter 1994), and the data a BR-VJP method needs. It is built once per
lower per hypergradient step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from mloc.runtime import optim
from mloc.runtime.base import tree
from mloc.runtime.base.overlap import averaged_grad
from mloc.runtime.base.precision import autocast_off
from mloc.runtime.base.tree import Params


@dataclass(eq=False)
class Problem:
    """One level of a multilevel program.

    ``loss(*[params_of[r] for r in reads])`` is this problem's loss; ``reads`` contains
    ``name`` itself when the loss depends on its own parameters. ``buffers`` are module
    buffers (BatchNorm statistics) that finite-difference passes must leave unchanged.
    """

    name: str
    params: Params
    loss: Callable[..., Tensor]
    reads: tuple[str, ...]
    optimizer: optim.Optimizer | None = None
    state: Any = None
    buffers: Params = ()
    index: int = field(init=False, default=-1)
    # Data parallelism: averages a tuple of per-replica tensors across processes (None on
    # one process). Set by `Hierarchy(reduce=...)`; see `Hierarchy` for where it applies.
    reduce: Callable[[Params], Params] | None = field(default=None, repr=False)

    def __post_init__(self):
        self.params = tuple(self.params)
        self.reads = tuple(self.reads)
        self.index = self.reads.index(self.name) if self.name in self.reads else -1
        if self.state is None and self.optimizer is not None:
            self.state = self.optimizer.init(self.params)

    @torch.no_grad()
    def step(self) -> None:
        """Commit one optimizer step from the parameters' ``.grad`` (in place)."""
        grads = tuple(p.grad for p in self.params)
        self.state = self.optimizer.commit(grads, self.state, self.params)


class LowerOp:
    """A lower problem linearized at ``args`` (the loss's arguments, in ``reads`` order)."""

    __slots__ = ("problem", "args", "theta", "buffers", "memo", "_grad")

    def __init__(self, problem: Problem, args: list, buffers: Params = ()):
        self.problem, self.args, self.buffers = problem, args, buffers
        self.theta = args[problem.index]
        self.memo = None  # a method's own data for this step (an unrolled trajectory)
        self._grad = None

    def loss_at(self, theta: Params, others: dict[int, Params] | None = None) -> Tensor:
        """The loss with this problem's parameters replaced by ``theta``."""
        args = list(self.args)
        args[self.problem.index] = theta
        if others:
            for i, value in others.items():
                args[i] = value
        return self.problem.loss(*args)

    def grad(self) -> Params:
        """``g = ∇_θ L`` at the current point, with its graph (computed once). A parameter
        the loss never reaches (a layer defined but not called) has ``g = 0``: its rows and
        columns of ``H`` and ``J`` are zero, so every method gives it a zero hypergradient.
        Taken with autocast off (:func:`~mloc.runtime.base.precision.autocast_off`): the
        solvers apply ``H`` many times and would amplify a bf16 linearization's round-off."""
        if self._grad is None:
            with autocast_off():        # in full precision: the methods amplify its round-off
                loss = self.problem.loss(*self.args)
                g = torch.autograd.grad(loss, self.theta, create_graph=True, allow_unused=True)
            self._grad = tree.dense(g, self.theta)
        return self._grad

    def hvp(self, p: Params, create_graph: bool = False) -> Params:
        """``H p`` with ``H = ∇²_θθ L`` (one backward through ``g``); averaged across
        data-parallel replicas, so every replica applies the Hessian of the whole batch.
        Rows of ``g`` that are constant in ``θ`` (an unused parameter's zeros, a loss
        linear in a parameter) contribute nothing: zeros where nothing reaches."""
        g = self.grad()
        outs, cots = g, p
        for t in g:
            if not t.requires_grad:
                keep = [i for i, t in enumerate(g) if t.requires_grad]
                outs, cots = [g[i] for i in keep], [p[i] for i in keep]
                break
        reduce = self.problem.reduce
        if not outs:
            hp = tree.zeros(self.theta)
        elif reduce is not None and not create_graph:   # averaged as the backward makes it
            with autocast_off():
                return averaged_grad(reduce, outs, self.theta, cots, retain_graph=True)
        else:
            with autocast_off():
                hp = tree.dense(torch.autograd.grad(outs, self.theta, cots, retain_graph=True,
                                                    create_graph=create_graph, allow_unused=True), self.theta)
        return hp if reduce is None or create_graph else reduce(hp)

    def mixed(self, q: Params, create_graph: bool = False):
        """The BR-VJP of solution ``q = H⁻¹v``: ``-J_xᵀ q = -∂/∂x ⟨∇_θ L, q⟩``.

        Returned as a VJP spec ``(outputs, cotangents)``: the contribution to an upper's
        parameters ``x`` is ``autograd.grad(outputs, x, cotangents)``.
        """
        return self.mixed_negated(tuple([-qi for qi in q]), create_graph)

    def mixed_negated(self, neg_q: Params, create_graph: bool = False):
        """:meth:`mixed` given ``-q`` (a method that forms ``-q`` directly saves a negation)."""
        return self.grad(), neg_q
