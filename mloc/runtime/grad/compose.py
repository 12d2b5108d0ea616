r"""Composition of BR-VJPs over a whole multilevel DAG by adjoint accumulation.

A program is a set of :class:`~mloc.runtime.grad.problem.Problem` s and hierarchy
:class:`Edge` s ``upper -> lower`` (the lower's best response depends on the upper), each
with a BR-VJP method. The hypergradient of an upper ``U`` is the total derivative of its
loss with every problem below it at its best response. Because every BR-VJP is linear in
its input, adjoints are accumulated in reverse topological order: each lower's BR-VJP is
applied once per upper update, to the sum of the adjoints of all paths that cross it
(cost linear in edges). The tests compare it with Betty's enumeration of paths
(exponential in dense DAGs; ``tests/runtime/paths.py``).

Semantics above two levels (``semantics=``):

- ``per_edge`` (the default): each lower's BR-VJP applies the implicit function theorem
  to that lower's own loss with every other problem held fixed (Betty's semantics). It
  is the exact nested hypergradient whenever no problem below a middle level feeds back
  into that middle level's loss, costs ``O(edges)`` BR-VJPs of the chosen methods, and
  works with every method, including the Hessian-free ones that scale.
- ``exact``: the true nested (Stackelberg) hypergradient. A middle level ``M`` is solved
  through its *reduced* objective ``L_M(θ_M, θ_below*(θ_M))``: its gradient is its own
  hypergradient (computed with a differentiable pass below ``M``), its Hessian-vector
  products and mixed products are total derivatives (a nested pass below ``M`` for each).
  Every Hessian-vector product of ``M`` therefore pays for BR-VJPs below it, and methods
  below a middle level must be differentiable (cg, neumann, first_order). Worth it when a
  lower feeds back into a middle level's loss (on random instances of oracle T the
  per-edge answer is off by tens of percent). A middle problem's solution then depends
  on every upper of a problem below it, which the processing order takes into account;
  a middle level without feedback is treated exactly as under ``per_edge``.

The upper's hypergradient is written to its parameters' ``.grad`` by one final
``torch.autograd.backward`` (``inputs=`` its parameters), so DDP synchronises once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from mloc.shared.composition import SEMANTICS, Composition, topo
from mloc.runtime.base import tree
from mloc.runtime.base.precision import autocast_off
from mloc.runtime.base.overlap import averaged_grad
from mloc.runtime.grad.adjoints import ReducedOp, backward, concat, flat, propagate, split
from mloc.runtime.grad.problem import LowerOp, Problem

__all__ = ["SEMANTICS", "Edge", "Hierarchy", "ReducedOp"]


@dataclass(frozen=True)
class Edge:
    """A hierarchy edge: ``lower`` is solved for given ``upper``, differentiated by ``method``.
    ``sharded``: how the method runs on FSDP2 shards under `strategy = fsdp` (the registry's
    ``MethodCaps.sharded_form``, written by the generated code); None: it cannot."""

    upper: str
    lower: str
    method: Any
    sharded: str | None = None


@dataclass(frozen=True)
class _Plan:
    """A :class:`~mloc.shared.composition.Composition` bound to this runtime's live tensors."""

    composition: Composition
    top: str
    up: tuple
    seeds: tuple[str, ...]
    prep: tuple  # (name, problem, method, buffers, nested) in `down` order
    seed_inputs: list | None  # the seeds' tensors when no seed is unrolled (fixed)
    shape: str  # the composition's, or "general" under data parallelism
    step: Any = None  # shape "bound": the whole step, one closure (`Hierarchy._bind`)


class Hierarchy:
    """A multilevel program for the runtime: problems, hierarchy edges and a semantics.

    ``hypergrad(name)`` accumulates the hypergradient of problem ``name`` into its
    parameters' ``.grad``, composed as ``name``'s :class:`~mloc.shared.composition.Composition`
    in ``compositions`` says: the planner's (generated code), or for a hierarchy built by hand
    :func:`mloc.ir.composition.compositions_of`'s. Plans bind it to the live tensors once and
    are cached.
    """

    def __init__(self, problems: Iterable[Problem], edges: Iterable[Edge],
                 semantics: str = "per_edge", reduce=None,
                 compositions: dict[str, Composition] | None = None):
        """``reduce`` (data parallelism): averages a tuple of tensors across replicas. It is
        applied where a hypergradient is not linear in the per-replica batches: the seed
        adjoints (the upper's gradient), every Hessian-vector product and SAMA's lower
        gradient, so each replica forms the same ``q`` as one process with the whole batch
        would; the final per-replica ``.grad`` is then averaged by the training loop. The
        straight-line two-level shapes are not used then. Unrolled (``itd``) and ``exact``
        nested steps stay per replica (their gradients are differentiated, not averaged)."""
        self.reduce = reduce
        self.problems = {p.name: p for p in problems}
        for p in self.problems.values():
            p.reduce = reduce
        self.edges = tuple(edges)
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, not {semantics!r}")
        self.semantics = semantics
        self.methods, self.uppers = {}, {n: set() for n in self.problems}
        self._check()
        self.lowers = {n: {e.lower for e in self.edges if e.upper == n} for n in self.problems}
        self._live = {n: p.params for n, p in self.problems.items()}
        self._args = {n: [self._live[r] for r in p.reads] for n, p in self.problems.items()}
        self._buffers = {n: tuple(b for r in p.reads for b in self.problems[r].buffers)
                         for n, p in self.problems.items()}
        self._compositions = dict(compositions or {})
        self._plans: dict[str, _Plan] = {}
        self._steps: dict[str, Any] = {}  # plans of shape "bound": top -> its step closure

    def _check(self):
        for p in self.problems.values():
            unknown = set(p.reads) - set(self.problems)
            if unknown:
                raise ValueError(f"problem {p.name!r} reads unknown problems {sorted(unknown)}")
        for e in self.edges:
            if e.upper not in self.problems or e.lower not in self.problems or e.upper == e.lower:
                raise ValueError(f"bad edge {e.upper!r} -> {e.lower!r}")
            if self.methods.setdefault(e.lower, e.method) != e.method:
                raise ValueError(f"edges into {e.lower!r} use different methods; one lower "
                                 "problem has one best-response method")
            if self.problems[e.lower].index < 0:
                raise ValueError(f"lower problem {e.lower!r} must read its own parameters")
            self.uppers[e.lower].add(e.upper)
        topo(self.problems, self.uppers)

    def composition(self, top: str) -> Composition:
        """``top``'s composition, as given (a ValueError when ``top`` has none)."""
        if top not in self._compositions:
            raise ValueError(f"no composition for {top!r}: a hierarchy built by hand takes "
                             "compositions=mloc.ir.composition.compositions_of(problems, edges, semantics)")
        return self._compositions[top]

    def plan(self, top: str) -> _Plan:
        if top in self._plans:
            return self._plans[top]
        c = self.composition(top)
        nested = {m: (steps, under) for m, steps, under in c.nested}
        prep = tuple((n, self.problems[n], self.methods[n], self._buffers[n], nested.get(n))
                     for n in c.down)
        seed_inputs = flat(self._live, c.seeds) if c.live_seeds else None
        shape = c.shape if self.reduce is None else "general"
        step = self._bind(top, prep[0], seed_inputs) if shape == "bound" else None
        plan = _Plan(c, top, c.up, c.seeds, prep, seed_inputs, shape, step)
        self._plans[top] = plan
        if step is not None:
            self._steps[top] = step
        return plan

    def linearize(self, plan: _Plan):
        """Build one op per problem below ``plan.top``; return ``(ops, points)``."""
        points = dict(self._live)
        ops = {}
        for name, problem, method, buffers, nested in plan.prep:
            args = [points[r] for r in problem.reads]
            if nested is None:
                op = LowerOp(problem, args, buffers)
            else:
                op = ReducedOp(problem, args, buffers)
                op.ctx = (*nested, self.methods, ops, points)
            ops[name] = op
            points[name] = method.prepare(op)
        return ops, points

    def seed_adjoints(self, plan, points, seed=None):
        """Partials of the top loss w.r.t. the problems it reads (adjoints to start from),
        at ``points`` (:meth:`linearize`'s), by problem."""
        if not plan.seeds:  # e.g. only first_order lowers: no indirect term, no direct one
            return {}
        top = self.problems[plan.top]
        loss = top.loss(*[points[r] for r in top.reads])
        if seed is not None:
            loss = seed(loss)
        inputs = plan.seed_inputs or flat(points, plan.seeds)
        with autocast_off():      # autocast wraps the forwards only
            if self.reduce is not None:     # the upper's direct gradient, averaged as it is made
                grads = averaged_grad(self.reduce, loss, inputs)
            else:
                grads = torch.autograd.grad(loss, inputs, allow_unused=True)
        adj = {}
        split(grads, points, plan.seeds, adj)
        return adj

    def hypergrad(self, name: str, accumulate: bool = True, seed: Callable[[Tensor], Tensor] | None = None,
                  sync=None):
        """Accumulate ``dL_name/dθ_name`` (best responses below) into ``.grad``, one backward.

        With ``accumulate=False`` nothing is written: the hypergradient is returned, one
        entry per parameter (``None`` for a parameter with no path to the loss; ``None``
        instead of the tuple when no parameter has one). The training loop takes it this
        way, as a hand-written loop takes ``autograd.grad``'s result.

        ``seed`` transforms the top loss before anything is differentiated: a loss scaler's
        ``scale`` (fp16). Every method's BR-VJP is homogeneous of degree one in the adjoint
        it is given (linear solves and unrolled sweeps are linear in it; a finite
        difference with ``ε = ε₀/‖q‖`` evaluates the same points and divides by an ``ε``
        scaled alike), so the result is the hypergradient times the scale, exactly so for
        a power of two when nothing overflows.

        ``sync`` (:class:`~mloc.runtime.base.overlap.OverlappedSync`, data parallelism, with
        ``accumulate=False``): the final backward averages the hypergradient across replicas
        as it runs, and returns it dense, the unreached parameters marked."""
        step = self._steps.get(name)  # a two-level finite-difference step, built once
        if step is not None:
            return step(accumulate, seed)
        plan = self._plans.get(name) or self.plan(name)
        if plan.shape != "general":
            if plan.step is not None:
                return plan.step(accumulate, seed)
            return (self._fused if plan.shape == "fused" else self._single)(plan, accumulate, seed)
        ops, points = self.linearize(plan)
        adj = self.seed_adjoints(plan, points, seed)
        direct = adj.pop(name, None)
        specs = propagate(plan.up, self.methods, ops, points, adj, False)
        params = self.problems[name].params
        if direct is not None:
            specs.append((params, direct))
        if specs:
            return backward(*(specs[0] if len(specs) == 1 else concat(specs)), params, accumulate,
                            sync if not accumulate else None)
        return None

    def _single(self, plan, accumulate=True, seed=None):
        """Two levels, the top's loss reads only the lower: seed, one BR-VJP, one backward."""
        (name, problem, method, buffers, _), = plan.prep
        op = LowerOp(problem, self._args[name], buffers)  # argument lists built once
        top = self.problems[plan.top]
        loss = top.loss(*self._args[plan.top])
        if seed is not None:
            loss = seed(loss)
        with autocast_off():
            v = torch.autograd.grad(loss, plan.seed_inputs, allow_unused=True)
        v = tree.fill_none(v, op.theta)
        spec = method.vjp(op, v) if v is not None else None
        if spec is not None:
            return backward(spec[0], spec[1], top.params, accumulate)
        return None

    def _bind(self, top, lower, seeds):
        """Shape ``"bound"``: the method's own straight-line step (``finite_diff``, ``sama``).

        The same computation as :meth:`_single`, specialized once by the method into one
        closure over everything fixed (see ``methods.finite.two_level_step``).
        """
        name, problem, method, buffers, _ = lower
        upper = self.problems[top]
        return method.two_level(problem, self._args[name], buffers, upper.loss, self._args[top],
                                seeds, upper.params)

    def _fused(self, plan, accumulate=True, seed=None):
        """Two levels, reverse-mode ITD: the top's loss at ``θ_K``, one backward through
        it and the unrolled steps (the seed and the sweep fused, as one writes it by hand)."""
        (name, problem, method, buffers, _), = plan.prep
        theta = method.unroll(LowerOp(problem, self._args[name], buffers))
        top = self.problems[plan.top]
        args = [theta if r == name else self._live[r] for r in top.reads]
        loss = top.loss(*args)
        return backward((loss if seed is None else seed(loss),), (None,), top.params, accumulate)
