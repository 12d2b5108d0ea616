"""Meta-Weight-Net written by hand in plain PyTorch: the reference `mloc run` must match.

No mloc import anywhere: this is the loop a user would write without mloc, using the
example's own model classes, data and losses from ``programs/reweighting.py``. It follows
the step semantics of ``mloc/runtime/program/engine.py``:

- ``random.seed(seed)``, ``torch.manual_seed(seed)``, then the modules in source order
  (classifier, then weight net), then the data loaders (classifier's, then weight net's);
  each data loader is cycled (a new ``iter`` when one is exhausted);
- one outer step = ``unroll`` lower steps, then one upper step;
- lower step: draw the classifier's next batch, gradient of its weighted loss with
  respect to its own parameters, SGD step (no momentum: ``p.add_(g, alpha=-lr)``, as
  ``torch.optim.SGD`` writes it);
- upper step: draw the weight net's next batch; its hypergradient at the classifier's
  *current* parameters, with the classifier's *most recent* batch in the lower loss
  ``L_tr``; Adam step (``torch.optim.Adam``'s single-tensor formulas, written out).

Hypergradients (``v = ∂L_val/∂θ``):

- ``finite_diff`` (DARTS, identity Hessian, central differences):
  ``ε = eps/‖v‖``, ``h = -(∇_λ L_tr(θ+εv) - ∇_λ L_tr(θ-εv)) / (2ε)``;
- ``neumann``: ``q = α Σ_{j=0..K} (I - αH)^j v`` (``K = iters``, i.e. ``K+1`` terms, as
  Betty's ``approx_inverse_hvp``), then ``h = -∂/∂λ ⟨∇_θ L_tr, q⟩``;
- ``cg``: ``q`` from ``iters`` steps of conjugate gradients on ``H q = v`` (``x₀ = 0``,
  ``r₀ = p₀ = v``; the direction update uses the new residual), then the same mixed product;
- ``sama`` (with plain SGD below): ``finite_diff`` applied to ``q = lr · v`` (SGD's
  ``∂Δθ/∂g``), ``ε = eps/‖q‖``.

``in_features``, ``hidden``, ``batch_size`` and ``clean_size`` change the sizes (the
benchmark's large case: 256-2048-10, batch 512); the defaults are the example's.

    loop = MWNLoop("finite_diff", eps=0.01, seed=0)
    for _ in range(20):
        loop.outer_step()
    loop.parameters()   # {"classifier": {name: tensor}, "weight_net": {...}}

``optimizers="torch"`` uses ``torch.optim.SGD``/``torch.optim.Adam`` objects instead of the
written-out updates (the test checks that both agree).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import torch
from torch.func import functional_call

_PROGRAMS = str(Path(__file__).resolve().parents[2] / "programs")
if _PROGRAMS not in sys.path:
    sys.path.insert(0, _PROGRAMS)

import reweighting as lib  # noqa: E402

METHODS = ("finite_diff", "neumann", "cg", "sama")


class MWNLoop:
    """Meta-Weight-Net: classifier (SGD, lower) under a weight net (Adam, upper)."""

    def __init__(self, method: str = "finite_diff", *, eps: float = 0.01, iters: int = 3,
                 alpha: float = 0.1, seed: int = 0, unroll: int = 1, lr: float = 0.1,
                 meta_lr: float = 1e-3, betas=(0.9, 0.999), adam_eps: float = 1e-8,
                 optimizers: str = "manual", dtype: torch.dtype | None = None,
                 in_features: int = 64, hidden: int = 256, batch_size: int = 100, clean_size: int = 500):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {method!r}")
        self.method, self.eps, self.iters, self.alpha = method, eps, iters, alpha
        self.unroll, self.lr, self.meta_lr, self.betas, self.adam_eps = unroll, lr, meta_lr, betas, adam_eps
        self.dtype = dtype
        random.seed(seed)
        torch.manual_seed(seed)
        self.classifier = lib.MLP(in_features=in_features, hidden=hidden, classes=10)
        self.weight_net = lib.WeightNet(hidden=100)
        if dtype is not None:
            self.classifier.to(dtype)
            self.weight_net.to(dtype)
        self.names = [n for n, _ in self.classifier.named_parameters()]
        self.theta = [p for _, p in self.classifier.named_parameters()]
        self.lam = list(self.weight_net.parameters())
        self.loaders = {"classifier": lib.noisy_digits(noise=0.4, batch_size=batch_size, features=in_features),
                        "weight_net": lib.clean_digits(batch_size=batch_size, size=clean_size,
                                                       features=in_features)}
        self.iters_ = {k: None for k in self.loaders}
        self.batch = None  # the classifier's most recent batch
        self.torch_optim = optimizers == "torch"
        if self.torch_optim:
            self.sgd = torch.optim.SGD(self.theta, lr=lr)
            self.adam = torch.optim.Adam(self.lam, lr=meta_lr, betas=betas, eps=adam_eps)
        else:
            self.adam_t = 0
            self.exp_avg = [torch.zeros_like(p) for p in self.lam]
            self.exp_avg_sq = [torch.zeros_like(p) for p in self.lam]

    # --- data ---------------------------------------------------------------------------
    def _next(self, name: str):
        it = self.iters_[name]
        if it is None:
            it = self.iters_[name] = iter(self.loaders[name])
        try:
            batch = next(it)
        except StopIteration:
            it = self.iters_[name] = iter(self.loaders[name])
            batch = next(it)
        if self.dtype is not None:
            batch = tuple(b.to(self.dtype) if b.is_floating_point() else b for b in batch)
        return batch

    # --- losses -------------------------------------------------------------------------
    def _classifier_at(self, params):
        """The classifier evaluated at ``params`` (a list aligned with ``self.names``)."""
        mapping = dict(zip(self.names, params))
        return lambda x: functional_call(self.classifier, mapping, (x,))

    def train_loss(self, classifier=None):
        return lib.weighted_ce(classifier or self.classifier, self.weight_net, self.batch)

    # --- steps --------------------------------------------------------------------------
    def lower_step(self) -> None:
        self.batch = self._next("classifier")
        loss = self.train_loss()
        grads = torch.autograd.grad(loss, self.theta)
        if self.torch_optim:
            for p, g in zip(self.theta, grads):
                p.grad = g
            self.sgd.step()
            return
        with torch.no_grad():
            for p, g in zip(self.theta, grads):
                p.add_(g, alpha=-self.lr)

    def hypergradient(self, val_batch):
        """The weight net's hypergradient at the current point (a list aligned with λ)."""
        v = torch.autograd.grad(lib.ce(self.classifier, val_batch), self.theta)
        if self.method == "sama":       # SGD's diagonal: ∂Δθ/∂g = lr
            v = [self.lr * g for g in v]
        if self.method in ("finite_diff", "sama"):
            with torch.no_grad():
                norm = torch.sqrt(sum((g * g).sum() for g in v))
                e = self.eps / norm
                plus = [p + e * g for p, g in zip(self.theta, v)]
                minus = [p - e * g for p, g in zip(self.theta, v)]
            g_plus = torch.autograd.grad(self.train_loss(self._classifier_at(plus)), self.lam)
            g_minus = torch.autograd.grad(self.train_loss(self._classifier_at(minus)), self.lam)
            return [-(a - b) / (2 * e) for a, b in zip(g_plus, g_minus)]
        g = torch.autograd.grad(self.train_loss(), self.theta, create_graph=True)
        if self.method == "cg":
            x = [torch.zeros_like(vi) for vi in v]
            r = p = list(v)
            rr = sum((ri * ri).sum() for ri in r)
            for _ in range(self.iters):
                hp = torch.autograd.grad(g, self.theta, p, retain_graph=True)
                a = rr / sum((pi * hi).sum() for pi, hi in zip(p, hp))
                x = [xi + a * pi for xi, pi in zip(x, p)]
                r = [ri - a * hi for ri, hi in zip(r, hp)]
                rr_new = sum((ri * ri).sum() for ri in r)
                beta = rr_new / rr
                p = [ri + beta * pi for ri, pi in zip(r, p)]
                rr = rr_new
            return list(torch.autograd.grad(g, self.lam, [-xi for xi in x]))
        # neumann
        p = acc = list(v)
        for _ in range(self.iters):
            hp = torch.autograd.grad(g, self.theta, p, retain_graph=True)
            p = [pi - self.alpha * hi for pi, hi in zip(p, hp)]
            acc = [a + pi for a, pi in zip(acc, p)]
        q = [self.alpha * a for a in acc]
        return list(torch.autograd.grad(g, self.lam, [-qi for qi in q]))

    def upper_step(self) -> None:
        val = self._next("weight_net")
        hyper = self.hypergradient(val)
        if self.torch_optim:
            for p, h in zip(self.lam, hyper):
                p.grad = h
            self.adam.step()
            return
        b1, b2 = self.betas
        self.adam_t += 1
        t = self.adam_t
        step_size = self.meta_lr / (1 - b1 ** t)
        bc2_sqrt = math.sqrt(1 - b2 ** t)
        with torch.no_grad():
            for p, h, m, s in zip(self.lam, hyper, self.exp_avg, self.exp_avg_sq):
                m.lerp_(h, 1 - b1)
                s.mul_(b2).addcmul_(h, h, value=1 - b2)
                denom = (s.sqrt() / bc2_sqrt).add_(self.adam_eps)
                p.addcdiv_(m, denom, value=-step_size)

    def outer_step(self) -> None:
        for _ in range(self.unroll):
            self.lower_step()
        self.upper_step()

    # --- results ------------------------------------------------------------------------
    def parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"classifier": {n: p.detach().clone() for n, p in self.classifier.named_parameters()},
                "weight_net": {n: p.detach().clone() for n, p in self.weight_net.named_parameters()}}


def run(method: str = "finite_diff", steps: int = 20, seed: int = 0, threads: int | None = 1,
        **kwargs) -> dict[str, dict[str, torch.Tensor]]:
    """``steps`` outer steps from ``seed``; the parameters of both problems afterwards."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        loop = MWNLoop(method, seed=seed, **kwargs)
        for _ in range(steps):
            loop.outer_step()
        return loop.parameters()
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="hand-written Meta-Weight-Net")
    ap.add_argument("--method", choices=METHODS, default="finite_diff")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for problem, ps in run(args.method, args.steps, args.seed).items():
        for name, t in ps.items():
            print(f"{problem}.{name}: norm {float(t.norm()):.8e}")
