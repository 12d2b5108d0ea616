r"""Composition of BR-VJPs over a whole multilevel DAG by adjoint accumulation.

A program is a set of :class:`~mloc.runtime.problem.Problem` s and hierarchy
:class:`Edge` s ``upper -> lower`` (the lower's best response depends on the upper), each
with a BR-VJP method. The hypergradient of an upper ``U`` is the total derivative of its
loss with every problem below it at its best response. Because every BR-VJP is linear in
its input, adjoints are accumulated in reverse topological order: each lower's BR-VJP is
applied once per upper update, to the sum of the adjoints of all paths that cross it
(cost linear in edges). :meth:`Hierarchy.hypergrad_paths` enumerates paths as Betty does
(exponential in dense DAGs); it is the reference the tests compare against.

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

import graphlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from mloc.runtime import tree
from mloc.runtime.problem import LowerOp, Problem

SEMANTICS = ("per_edge", "exact")


@dataclass(frozen=True)
class Edge:
    """A hierarchy edge: ``lower`` is solved for given ``upper``, differentiated by ``method``."""

    upper: str
    lower: str
    method: Any


@dataclass(frozen=True)
class _Plan:
    """Everything about one upper's hypergradient that does not change between steps."""

    top: str
    down: tuple[str, ...]  # problems below `top`, uppers first (linearization order)
    up: tuple[tuple[str, tuple[str, ...], bool], ...]  # (lower, inner targets, feeds top)
    seeds: tuple[str, ...]  # problems read by top's loss whose adjoints start the pass
    nested: dict  # exact semantics: middle -> (its `up` steps, problems below it)
    prep: tuple  # (name, problem, method, buffers, nested) in `down` order
    seed_inputs: list | None  # the seeds' tensors when no seed is unrolled (fixed)
    shape: str  # "bound" | "fused" | "single" | "general": which of the step functions runs
    step: Any = None  # shape "bound": the whole step, one closure (`Hierarchy._bind`)


def _topo(nodes: Iterable[str], preds: dict[str, set[str]], hint: str = "") -> tuple[str, ...]:
    nodes = set(nodes)
    try:
        sorter = graphlib.TopologicalSorter({n: sorted(preds.get(n, set()) & nodes)
                                             for n in sorted(nodes)})
        return tuple(sorter.static_order())
    except graphlib.CycleError as err:
        raise ValueError(f"cycle among problems: {' -> '.join(err.args[1])}{hint}") from None


def _flat(points, names):
    return [t for n in names for t in points[n]]


def _split(grads, points, names, adj):
    """Add ``grads`` (flat, aligned with ``names``' points) into the adjoints ``adj``."""
    i = 0
    for name in names:
        n = len(points[name])
        g = tree.fill_none(grads[i:i + n], points[name])
        i += n
        if g is not None:
            adj[name] = g if name not in adj else tree.add(adj[name], g)


def _reaching(outs, cots):
    """Drop outputs that reach no parameter (a lower whose loss ignores an upper)."""
    for t in outs:
        if not t.requires_grad:
            keep = [i for i, t in enumerate(outs) if t.requires_grad]
            return [outs[i] for i in keep], [cots[i] for i in keep]
    return outs, cots


def _grad(outs, cots, inputs, create_graph=False):
    """``autograd.grad`` of a spec into ``inputs``, graph retained, unused inputs None."""
    outs, cots = _reaching(outs, cots)
    if not outs:
        return (None,) * len(inputs)
    return torch.autograd.grad(outs, inputs, cots, retain_graph=True, create_graph=create_graph,
                               allow_unused=True)


def _propagate(steps, methods, ops, points, adj, create_graph):
    """Apply each lower's BR-VJP once (``steps`` bottom-up); return the specs leaving it."""
    specs = []
    for name, inner, out in steps:
        a = adj.pop(name, None)
        if a is None:
            continue
        spec = methods[name].vjp(ops[name], a, create_graph)
        if spec is None:
            continue
        if inner:
            _split(_grad(*spec, _flat(points, inner), create_graph), points, inner, adj)
        if out:
            specs.append(spec)
    return specs


def _concat(specs):
    """One ``(outputs, cotangents)`` pair out of several specs."""
    return [t for s in specs for t in s[0]], [t for s in specs for t in s[1]]


def _backward(outs, cots, params, accumulate=True):
    """The one final backward into ``params``: accumulated into their ``.grad`` (as
    ``loss.backward()`` does), or, with ``accumulate=False``, returned (``None`` for a
    parameter no output reaches, and ``None`` instead of the tuple when none does)."""
    for t in outs:
        if not t.requires_grad:
            outs, cots = _reaching(outs, cots)
            break
    if not outs:
        return None
    if accumulate:
        torch.autograd.backward(outs, cots, inputs=params)
        return None
    return torch.autograd.grad(outs, params, cots, allow_unused=True)


def _pull(specs, theta, create_graph):
    """``Σ autograd.grad(outputs, θ, cotangents)`` over specs (zeros when none reach θ)."""
    return tree.dense(_grad(*_concat(specs), theta, create_graph), theta)


class ReducedOp(LowerOp):
    """A middle problem linearized through its reduced objective (``exact`` semantics)."""

    __slots__ = ("ctx",)

    def _pass(self, vector, negate, create_graph):
        """Total VJP of ``g`` with cotangent ``vector`` into ``θ`` and the nested specs."""
        steps, below, methods, ops, points = self.ctx
        n = len(self.theta)
        cot = tree.neg(vector) if negate else vector
        grads = _grad(self.grad(), cot, self.theta + tuple(_flat(points, below)), create_graph)
        adj = {}
        _split(grads[n:], points, below, adj)
        return grads[:n], cot, _propagate(steps, methods, ops, points, adj, create_graph)

    def grad(self):
        if self._grad is None:
            steps, below, methods, ops, points = self.ctx
            loss = self.problem.loss(*self.args)
            n = len(self.theta)
            grads = torch.autograd.grad(loss, self.theta + tuple(_flat(points, below)),
                                        create_graph=True, allow_unused=True)
            adj = {}
            _split(grads[n:], points, below, adj)
            specs = _propagate(steps, methods, ops, points, adj, True)
            self._grad = tree.add(tree.dense(grads[:n], self.theta), _pull(specs, self.theta, True))
        return self._grad

    def hvp(self, p, create_graph=False):
        direct, _, specs = self._pass(p, False, create_graph)
        return tree.add(tree.dense(direct, self.theta), _pull(specs, self.theta, create_graph))

    def mixed(self, q, create_graph=False):
        _, cot, specs = self._pass(q, True, create_graph)
        return _concat([(self.grad(), cot)] + specs)

    def mixed_negated(self, neg_q, create_graph=False):
        _, cot, specs = self._pass(neg_q, False, create_graph)
        return _concat([(self.grad(), cot)] + specs)


class Hierarchy:
    """A multilevel program for the runtime: problems, hierarchy edges and a semantics.

    ``hypergrad(name)`` accumulates the hypergradient of problem ``name`` into its
    parameters' ``.grad``; plans (orders, targets) are built once per upper and cached.
    """

    def __init__(self, problems: Iterable[Problem], edges: Iterable[Edge],
                 semantics: str = "per_edge", reduce=None):
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
        _topo(self.problems, self.uppers)

    def _below(self, name):
        seen, stack = set(), [name]
        while stack:
            for low in self.lowers[stack.pop()] - seen:
                seen.add(low)
                stack.append(low)
        return seen

    def _targets(self, node, scope, below):
        """Where ``node``'s BR-VJP sends adjoints (``exact`` adds its lowers' uppers)."""
        targets = set(self.uppers[node])
        for b in below[node]:  # empty unless `exact` and a lower feeds back into node
            targets |= self.uppers[b]
        return (targets - below[node] - {node}) & scope

    def plan(self, top: str) -> _Plan:
        if top in self._plans:
            return self._plans[top]
        inside = self._below(top)
        scope = inside | {top}
        below = self._reduced_below(inside)
        targets = {n: set() if getattr(self.methods[n], "zero", False)
                   else self._targets(n, scope, below) for n in inside}
        down = tuple(n for n in _topo(scope, self.uppers) if n != top)
        order = _topo(inside, {n: {b for b in inside if n in targets[b]} for n in inside},
                      " (under `exact` semantics, two problems that feed back through a shared"
                      " lower form a simultaneous game; use `per_edge`)")
        steps = lambda nodes: tuple(  # noqa: E731
            (n, tuple(sorted(targets[n] & nodes)), bool(targets[n] - nodes))
            for n in order if n in nodes and targets[n])
        nested = {}
        for m in sorted(n for n in inside if below[n]):
            self._check_differentiable(m, below[m])
            nested[m] = (steps(below[m]), tuple(sorted(below[m])))
        seeds = tuple(r for r in self.problems[top].reads if r == top or targets.get(r))
        prep = tuple((n, self.problems[n], self.methods[n], self._buffers[n], nested.get(n))
                     for n in down)
        fixed = not any(getattr(self.methods.get(r), "unrolls", False) for r in seeds)
        up = steps(inside)
        seed_inputs = _flat(self._live, seeds) if fixed else None
        shape = self._shape(down, up, seeds)
        step = self._bind(top, prep[0], seed_inputs) if shape == "bound" else None
        plan = _Plan(top, down, up, seeds, nested, prep, seed_inputs, shape, step)
        self._plans[top] = plan
        if step is not None:
            self._steps[top] = step
        return plan

    def _reduced_below(self, inside):
        """For each middle solved through its reduced objective (``exact`` semantics, and a
        lower below it feeds back into its loss), the problems below it; else empty."""
        if self.semantics == "per_edge":
            return {n: set() for n in inside}
        below = {n: self._below(n) & inside for n in inside}
        return {n: b if b & set(self.problems[n].reads) else set() for n, b in below.items()}

    def _shape(self, down, up, seeds):
        """Two levels (one lower feeding only the top) get a straight-line step."""
        if self.reduce is not None:
            return "general"
        if len(down) != 1 or len(up) != 1 or up[0][1:] != ((), True):
            return "general"
        method = self.methods[down[0]]
        if getattr(method, "fusable", False):
            return "fused"
        if seeds != down or getattr(method, "unrolls", False):
            return "general"
        return "bound" if hasattr(method, "two_level") else "single"

    def _check_differentiable(self, middle, below):
        for b in below:
            if getattr(self.methods.get(b), "unrolls", False):
                raise ValueError(f"exact semantics: {b!r} lies below middle level {middle!r} "
                                 "and cannot be unrolled (use cg or neumann there)")

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

    def _seed(self, plan, points, seed=None):
        """Partials of the top loss w.r.t. the problems it reads (adjoints to start from)."""
        if not plan.seeds:  # e.g. only first_order lowers: no indirect term, no direct one
            return {}
        top = self.problems[plan.top]
        loss = top.loss(*[points[r] for r in top.reads])
        if seed is not None:
            loss = seed(loss)
        inputs = plan.seed_inputs or _flat(points, plan.seeds)
        grads = torch.autograd.grad(loss, inputs, allow_unused=True)
        if self.reduce is not None:
            grads = self.reduce(tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)))
        adj = {}
        _split(grads, points, plan.seeds, adj)
        return adj

    def hypergrad(self, name: str, accumulate: bool = True, seed: Callable[[Tensor], Tensor] | None = None):
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
        a power of two when nothing overflows."""
        step = self._steps.get(name)  # a two-level finite-difference step, built once
        if step is not None:
            return step(accumulate, seed)
        plan = self._plans.get(name) or self.plan(name)
        if plan.shape != "general":
            if plan.step is not None:
                return plan.step(accumulate, seed)
            return (self._fused if plan.shape == "fused" else self._single)(plan, accumulate, seed)
        ops, points = self.linearize(plan)
        adj = self._seed(plan, points, seed)
        direct = adj.pop(name, None)
        specs = _propagate(plan.up, self.methods, ops, points, adj, False)
        params = self.problems[name].params
        if direct is not None:
            specs.append((params, direct))
        if specs:
            return _backward(*(specs[0] if len(specs) == 1 else _concat(specs)), params, accumulate)
        return None

    def _single(self, plan, accumulate=True, seed=None):
        """Two levels, the top's loss reads only the lower: seed, one BR-VJP, one backward."""
        (name, problem, method, buffers, _), = plan.prep
        op = LowerOp(problem, self._args[name], buffers)  # argument lists built once
        top = self.problems[plan.top]
        loss = top.loss(*self._args[plan.top])
        if seed is not None:
            loss = seed(loss)
        v = torch.autograd.grad(loss, plan.seed_inputs, allow_unused=True)
        v = tree.fill_none(v, op.theta)
        spec = method.vjp(op, v) if v is not None else None
        if spec is not None:
            return _backward(spec[0], spec[1], top.params, accumulate)
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
        return _backward((loss if seed is None else seed(loss),), (None,), top.params, accumulate)

    def hypergrad_paths(self, name: str):
        """Reference: the hypergradient as a sum over paths, each re-applying its BR-VJPs.

        Betty's algorithm (one pass per path from ``name`` down to each problem its loss
        reads); exponential in dense DAGs. Returns the gradient instead of writing ``.grad``.
        """
        plan = self.plan(name)
        ops, points = self.linearize(plan)
        adj = self._seed(plan, points)
        targets = {n: inner + ((name,) if out else ()) for n, inner, out in plan.up}
        total = [adj.pop(name, None) or tree.zeros(points[name])]

        def walk(node, vector):
            spec = self.methods[node].vjp(ops[node], vector)
            for t in targets.get(node, ()) if spec else ():
                g = tree.fill_none(_grad(*spec, points[t]), points[t])
                if g is None:
                    continue
                if t == name:
                    total[0] = tree.add(total[0], g)
                else:
                    walk(t, g)

        for node, vector in adj.items():
            walk(node, vector)
        return tuple(t.detach() for t in total[0])

