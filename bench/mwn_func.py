"""Meta-Weight-Net written with `torch.func` and compiled by hand, as a strong user would.

The same program as ``tests/reference/mwn_hand.py`` (same modules, data, seeds, step
semantics and hypergradients: ``finite_diff``, ``sama`` with SGD below, ``neumann``, ``cg``),
but each step is a pure function of tensors, so that ``torch.compile(fullgraph=True)``
captures it whole: ``torch.autograd.grad`` inside a compiled function breaks the graph (and
a double backward through it fails), the ``torch.func`` transforms do not.

- lower step ``(θ, λ, x, y) -> θ'``: ``grad`` of the weighted loss, SGD written out;
- upper step ``(θ, λ, m, s, t, batch, val_batch) -> (λ', m', s', t')``: ``v = grad`` of the
  clean loss in ``θ``; ``finite_diff``/``sama``: one ``grad`` in ``λ`` of
  ``L(θ+εq, λ) − L(θ−εq, λ)``, divided by ``−2ε``; ``neumann``/``cg``: ``vjp`` of
  ``∇_θ L`` in ``(θ, λ)`` once, whose function gives ``Hp`` (its ``θ`` part) for every
  series/CG iteration and ``−Jᵀq`` (its ``λ`` part) at the end: the hand loop's double
  backward, as transforms; then Adam written out (``t`` a 0-dim float64 tensor, so that
  one graph serves every step).

The parameters and Adam's moments are plain tensors (dicts by name) that each step
returns anew. ``compile=False`` runs the same functions eagerly (slower than the
``autograd.grad`` loop: the transforms' wrappers cost Python time). ``steps.compile_seconds``
is the wall time of the first call of each compiled function (where compiling happens).

    loop = FuncMWN("neumann", compile=True, iters=3, alpha=0.1)
    for _ in range(20):
        loop.outer_step()
    loop.parameters()   # as MWNLoop.parameters()
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call, grad, vjp

_ROOT = Path(__file__).resolve().parents[1]
for _p in (_ROOT / "programs", _ROOT / "tests" / "reference"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import mwn_hand  # noqa: E402  (tests/reference: the hand loop this one mirrors)
import reweighting as lib  # noqa: E402

METHODS = ("finite_diff", "sama", "neumann", "cg")


def _tsum(xs):
    total = None
    for x in xs:
        total = x if total is None else total + x
    return total


class FuncMWN:
    """Meta-Weight-Net as pure ``torch.func`` steps; compiled with ``compile=True``."""

    def __init__(self, method: str = "finite_diff", *, compile: bool = False, eps: float = 0.01,
                 iters: int = 3, alpha: float = 0.1, seed: int = 0, unroll: int = 1, lr: float = 0.1,
                 meta_lr: float = 1e-3, betas=(0.9, 0.999), adam_eps: float = 1e-8,
                 dtype: torch.dtype | None = None, in_features: int = 64, hidden: int = 256,
                 batch_size: int = 100, clean_size: int = 500):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {method!r}")
        self.method, self.unroll, self.dtype = method, unroll, dtype
        # built in MWNLoop's order from the same seeds: same parameters, same batches
        random.seed(seed)
        torch.manual_seed(seed)
        classifier = lib.MLP(in_features=in_features, hidden=hidden, classes=10)
        weight_net = lib.WeightNet(hidden=100)
        if dtype is not None:
            classifier.to(dtype)
            weight_net.to(dtype)
        self.loaders = {"classifier": lib.noisy_digits(noise=0.4, batch_size=batch_size, features=in_features),
                        "weight_net": lib.clean_digits(batch_size=batch_size, size=clean_size,
                                                       features=in_features)}
        self.iters_ = {k: None for k in self.loaders}
        self.theta = {n: p.detach().clone() for n, p in classifier.named_parameters()}
        self.lam = {n: p.detach().clone() for n, p in weight_net.named_parameters()}
        self.m = {n: torch.zeros_like(p) for n, p in self.lam.items()}
        self.s = {n: torch.zeros_like(p) for n, p in self.lam.items()}
        self.t = torch.zeros((), dtype=torch.float64)
        self.batch = None
        lower, upper = _steps(classifier, weight_net, method, lr=lr, eps=eps, iters=iters, alpha=alpha,
                              meta_lr=meta_lr, betas=betas, adam_eps=adam_eps)
        self.compiled = compile
        if compile:
            lower = torch.compile(lower, fullgraph=True)
            upper = torch.compile(upper, fullgraph=True)
        self._lower, self._upper = lower, upper
        self.compile_seconds = {"lower": None, "upper": None}

    # the hand loop's own batch drawing (the same loaders, the same order)
    _next = mwn_hand.MWNLoop._next

    def _timed(self, kind, fn, *args):
        if self.compile_seconds[kind] is not None or not self.compiled:
            return fn(*args)
        start = time.perf_counter()
        out = fn(*args)
        self.compile_seconds[kind] = time.perf_counter() - start
        return out

    def lower_step(self) -> None:
        self.batch = self._next("classifier")
        self.theta = self._timed("lower", self._lower, self.theta, self.lam, *self.batch)

    def upper_step(self) -> None:
        val = self._next("weight_net")
        self.lam, self.m, self.s, self.t = self._timed(
            "upper", self._upper, self.theta, self.lam, self.m, self.s, self.t, *self.batch, *val)

    def outer_step(self) -> None:
        for _ in range(self.unroll):
            self.lower_step()
        self.upper_step()

    def parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"classifier": {n: p.clone() for n, p in self.theta.items()},
                "weight_net": {n: p.clone() for n, p in self.lam.items()}}


def _steps(classifier, weight_net, method, *, lr, eps, iters, alpha, meta_lr, betas, adam_eps):
    """The lower and upper step functions (pure: tensors in, tensors out)."""
    b1, b2 = betas

    def at(module, params):
        return lambda x: functional_call(module, params, (x,))

    def train_loss(theta, lam, x, y):
        return lib.weighted_ce(at(classifier, theta), at(weight_net, lam), (x, y))

    def val_loss(theta, x, y):
        return lib.ce(at(classifier, theta), (x, y))

    def lower(theta, lam, x, y):
        g = grad(train_loss)(theta, lam, x, y)
        return {k: theta[k] - lr * g[k] for k in theta}

    def hypergradient(theta, lam, x, y, xv, yv):
        v = grad(val_loss)(theta, xv, yv)
        if method in ("finite_diff", "sama"):
            q = {k: lr * g for k, g in v.items()} if method == "sama" else v
            e = eps / torch.sqrt(_tsum((g * g).sum() for g in q.values()))
            plus = {k: theta[k] + e * q[k] for k in theta}
            minus = {k: theta[k] - e * q[k] for k in theta}
            diff = grad(lambda l: train_loss(plus, l, x, y) - train_loss(minus, l, x, y))(lam)
            return {k: -d / (2 * e) for k, d in diff.items()}
        # implicit: one linearisation of ∇_θ L at (θ, λ); its θ part is H·p, its λ part Jᵀ·p
        _, pullback = vjp(lambda th, l: grad(train_loss)(th, l, x, y), theta, lam)

        def hvp(p):
            return pullback(p)[0]
        if method == "neumann":
            p = acc = v
            for _ in range(iters):
                hp = hvp(p)
                p = {k: p[k] - alpha * hp[k] for k in p}
                acc = {k: acc[k] + p[k] for k in acc}
            q = {k: alpha * a for k, a in acc.items()}
        else:  # cg on H q = v
            q = {k: torch.zeros_like(g) for k, g in v.items()}
            r = p = v
            rr = _tsum((g * g).sum() for g in r.values())
            for _ in range(iters):
                hp = hvp(p)
                a = rr / _tsum((p[k] * hp[k]).sum() for k in p)
                q = {k: q[k] + a * p[k] for k in q}
                r = {k: r[k] - a * hp[k] for k in r}
                rr_new = _tsum((g * g).sum() for g in r.values())
                beta = rr_new / rr
                p = {k: r[k] + beta * p[k] for k in r}
                rr = rr_new
        return pullback({k: -g for k, g in q.items()})[1]

    def upper(theta, lam, m, s, t, x, y, xv, yv):
        h = hypergradient(theta, lam, x, y, xv, yv)
        t = t + 1
        step_size = meta_lr / (1 - b1 ** t)
        bc2_sqrt = torch.sqrt(1 - b2 ** t)
        m = {k: m[k] + (1 - b1) * (h[k] - m[k]) for k in m}          # lerp
        s = {k: s[k] * b2 + (1 - b2) * h[k] * h[k] for k in s}
        lam = {k: lam[k] - step_size * m[k] / (torch.sqrt(s[k]) / bc2_sqrt + adam_eps) for k in lam}
        return lam, m, s, t

    return lower, upper
