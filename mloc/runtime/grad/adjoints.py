"""Adjoint accumulation: the primitives the composer (:mod:`mloc.runtime.grad.compose`) runs.

Adjoints are kept per problem (``adj[name]``, a tuple aligned with its point). A BR-VJP
returns a *spec* ``(outputs, cotangents)``; :func:`propagate` applies each lower's BR-VJP
once, bottom-up, and sends the gradient of its spec to the problems inside the pass
(:func:`split`); the specs that reach the top are folded into one final backward
(:func:`backward`). :class:`ReducedOp` linearizes a middle problem through its reduced
objective (``exact`` semantics): every product of it is a nested pass below it.
"""

from __future__ import annotations

import torch

from mloc.runtime.base import tree
from mloc.runtime.base.precision import autocast_off
from mloc.runtime.grad.problem import LowerOp


def flat(points, names):
    return [t for n in names for t in points[n]]


def split(grads, points, names, adj):
    """Add ``grads`` (flat, aligned with ``names``' points) into the adjoints ``adj``."""
    i = 0
    for name in names:
        n = len(points[name])
        g = tree.fill_none(grads[i:i + n], points[name])
        i += n
        if g is not None:
            adj[name] = g if name not in adj else tree.add(adj[name], g)


def reaching(outs, cots):
    """Drop outputs that reach no parameter (a lower whose loss ignores an upper)."""
    for t in outs:
        if not t.requires_grad:
            keep = [i for i, t in enumerate(outs) if t.requires_grad]
            return [outs[i] for i in keep], [cots[i] for i in keep]
    return outs, cots


def grad_of(outs, cots, inputs, create_graph=False):
    """``autograd.grad`` of a spec into ``inputs``, graph retained, unused inputs None."""
    outs, cots = reaching(outs, cots)
    if not outs:
        return (None,) * len(inputs)
    with autocast_off():      # autocast wraps the forwards only
        return torch.autograd.grad(outs, inputs, cots, retain_graph=True, create_graph=create_graph,
                                   allow_unused=True)


def propagate(steps, methods, ops, points, adj, create_graph):
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
            split(grad_of(*spec, flat(points, inner), create_graph), points, inner, adj)
        if out:
            specs.append(spec)
    return specs


def concat(specs):
    """One ``(outputs, cotangents)`` pair out of several specs."""
    return [t for s in specs for t in s[0]], [t for s in specs for t in s[1]]


def backward(outs, cots, params, accumulate=True, sync=None):
    """The one final backward into ``params``: accumulated into their ``.grad`` (as
    ``loss.backward()`` does), or, with ``accumulate=False``, returned (``None`` for a
    parameter no output reaches, and ``None`` instead of the tuple when none does).
    ``sync`` (:class:`~mloc.runtime.base.overlap.OverlappedSync`, data parallelism with
    overlap): the gradients are averaged across replicas during the backward and returned
    dense, the unreached marked (``accumulate`` must be False)."""
    for t in outs:
        if not t.requires_grad:
            outs, cots = reaching(outs, cots)
            break
    if not outs:
        return None
    if sync is not None and accumulate:
        raise ValueError("an overlapped final backward returns its gradients (accumulate=False)")
    with autocast_off():      # autocast wraps the forwards only
        if sync is not None:
            return sync.grad(outs, params, cots, final=True)
        if accumulate:
            torch.autograd.backward(outs, cots, inputs=params)
            return None
        return torch.autograd.grad(outs, params, cots, allow_unused=True)


def pull(specs, theta, create_graph):
    """``Σ autograd.grad(outputs, θ, cotangents)`` over specs (zeros when none reach θ)."""
    return tree.dense(grad_of(*concat(specs), theta, create_graph), theta)


class ReducedOp(LowerOp):
    """A middle problem linearized through its reduced objective (``exact`` semantics)."""

    __slots__ = ("ctx",)

    def _pass(self, vector, negate, create_graph):
        """Total VJP of ``g`` with cotangent ``vector`` into ``θ`` and the nested specs."""
        steps, below, methods, ops, points = self.ctx
        n = len(self.theta)
        cot = tree.neg(vector) if negate else vector
        grads = grad_of(self.grad(), cot, self.theta + tuple(flat(points, below)), create_graph)
        adj = {}
        split(grads[n:], points, below, adj)
        return grads[:n], cot, propagate(steps, methods, ops, points, adj, create_graph)

    def grad(self):
        if self._grad is None:
            steps, below, methods, ops, points = self.ctx
            n = len(self.theta)
            with autocast_off():        # in full precision, as LowerOp.grad
                loss = self.problem.loss(*self.args)
                grads = torch.autograd.grad(loss, self.theta + tuple(flat(points, below)),
                                            create_graph=True, allow_unused=True)
            adj = {}
            split(grads[n:], points, below, adj)
            specs = propagate(steps, methods, ops, points, adj, True)
            self._grad = tree.add(tree.dense(grads[:n], self.theta), pull(specs, self.theta, True))
        return self._grad

    def hvp(self, p, create_graph=False):
        direct, _, specs = self._pass(p, False, create_graph)
        return tree.add(tree.dense(direct, self.theta), pull(specs, self.theta, create_graph))

    def mixed(self, q, create_graph=False):
        _, cot, specs = self._pass(q, True, create_graph)
        return concat([(self.grad(), cot)] + specs)

    def mixed_negated(self, neg_q, create_graph=False):
        _, cot, specs = self._pass(neg_q, False, create_graph)
        return concat([(self.grad(), cot)] + specs)
