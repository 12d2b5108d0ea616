"""Hand-written PyTorch hypergradient steps for Meta-Weight-Net, the benchmark's baseline.

Each function computes, with plain ``torch.autograd`` calls and no abstraction, the same
hypergradient as one ``mloc.runtime`` method and writes it to the weight net's ``.grad``:
the code one would write by hand for that method. ``theta`` are the classifier's
parameters, ``phi`` the weight net's; ``inner(theta, phi)`` and ``outer(theta)`` are the
weighted training loss and the clean validation loss.
"""

from __future__ import annotations

import torch

grad = torch.autograd.grad


def _central(inner, theta, phi, q, eps):
    with torch.no_grad():
        e = eps / torch.sqrt(sum((x * x).sum() for x in q)).clamp_min(1e-38)  # like mloc's
        plus = [p + e * x for p, x in zip(theta, q)]
        minus = [p - e * x for p, x in zip(theta, q)]
    lp, lm = inner(plus, phi), inner(minus, phi)
    # ∇L₊ − ∇L₋ in one backward, then −(·)/2ε: the difference quotient as written by hand
    # (subtracting the two nearly equal gradients before scaling them)
    diff = grad([lp, lm], phi, [torch.ones_like(lm), -torch.ones_like(lm)])
    with torch.no_grad():
        for p, d in zip(phi, diff):
            p.grad = -d / (2 * e)


def finite_diff(inner, outer, theta, phi, lr, eps=0.01):
    v = grad(outer(theta), theta)
    _central(inner, theta, phi, v, eps)


def sama(inner, outer, theta, phi, lr, eps=0.01):
    v = grad(outer(theta), theta)
    _central(inner, theta, phi, [lr * x for x in v], eps)


def neumann(inner, outer, theta, phi, lr, iters=3, alpha=0.1):
    v = grad(outer(theta), theta)
    g = grad(inner(theta, phi), theta, create_graph=True)
    p = acc = v
    for _ in range(iters):
        hp = grad(g, theta, p, retain_graph=True)
        p = [a - alpha * b for a, b in zip(p, hp)]
        acc = [a + b for a, b in zip(acc, p)]
    torch.autograd.backward(g, [-alpha * a for a in acc], inputs=phi)


def cg(inner, outer, theta, phi, lr, iters=3):
    v = grad(outer(theta), theta)
    g = grad(inner(theta, phi), theta, create_graph=True)
    dot = lambda a, b: sum((x * y).sum() for x, y in zip(a, b))  # noqa: E731
    x = [torch.zeros_like(t) for t in v]
    r = p = v
    rr = dot(r, r)
    for _ in range(iters):  # guarded like mloc's (no 0/0 once converged, no host sync)
        hp = grad(g, theta, p, retain_graph=True)
        active = rr > 0
        alpha = torch.where(active, rr, 0.0) / torch.where(active, dot(p, hp), 1.0)
        x = [a + alpha * b for a, b in zip(x, p)]
        r = [a - alpha * b for a, b in zip(r, hp)]
        rr_new = dot(r, r)
        beta = torch.where(active, rr_new, 0.0) / torch.where(active, rr, 1.0)
        p = [a + beta * b for a, b in zip(r, p)]
        rr = rr_new
    torch.autograd.backward(g, [-a for a in x], inputs=phi)


def itd(inner, outer, theta, phi, lr, steps=1):
    for _ in range(steps):
        g = grad(inner(theta, phi), theta, create_graph=True)
        theta = [p - lr * d for p, d in zip(theta, g)]
    outer(theta).backward(inputs=phi)
