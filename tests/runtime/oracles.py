"""Closed-form hypergradient oracles (shared/reference/hypergradients.md), in float64.

Each oracle builds a runtime program (problems + edges) at its exact solution, and gives
the closed forms the tests compare with. Each closed form is checked in
``test_oracles.py`` against central differences of an outer objective whose inner
problems are solved exactly (linear solves), so no formula here is taken on trust.
"""

from __future__ import annotations

import torch

from mloc.runtime import Edge, Problem, sgd
from tests.runtime.hand_built import hierarchy

F64 = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=F64)


def spd(g, d, lo=1.0, hi=4.0):
    """A random symmetric positive definite matrix with spectrum in ``[lo, hi]``."""
    q, _ = torch.linalg.qr(randn(g, d, d))
    eig = lo + (hi - lo) * torch.rand(d, generator=g, dtype=F64)
    eig[0], eig[-1] = lo, hi
    return q @ torch.diag(eig) @ q.T


def leaf(x):
    return x.clone().requires_grad_(True)


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def central(f, x, h=1e-3):
    """∇f(x) by central differences with one Richardson step (error O(h⁴) + O(ε/h)).

    On the quadratic oracles the truncation term vanishes and round-off (~1e-13 relative
    for h = 1e-3) is all that remains; on the ridge oracle (e^λ) h⁴ ≈ 1e-12 adds to it.
    """
    def diff(step):
        out = torch.zeros_like(x)
        for i in range(len(x)):
            e = torch.zeros_like(x)
            e[i] = step
            out[i] = (f(x + e) - f(x - e)) / (2 * step)
        return out
    return (4 * diff(h / 2) - diff(h)) / 3


# --- the per-method form of q ≈ H⁻¹v, at an exact solution --------------------------------

def krylov_basis(h, v, k):
    """Orthonormal basis of span{v, Hv, …, H^{k-1}v} (Arnoldi, reorthogonalised twice)."""
    basis = [v / torch.linalg.vector_norm(v)]
    for _ in range(k - 1):
        w = h @ basis[-1]
        for _ in range(2):
            for b in basis:
                w = w - (b @ w) * b
        basis.append(w / torch.linalg.vector_norm(w))
    return torch.stack(basis, 1)


def q_unrolled(h, v, steps, lr):
    """ITD with ``steps`` SGD steps of size ``lr`` from the solution: H⁻¹(I-(I-lr·H)^T)v."""
    eye = torch.eye(len(v), dtype=F64)
    return torch.linalg.solve(h, (eye - torch.linalg.matrix_power(eye - lr * h, steps)) @ v)


def q_neumann(h, v, iters, alpha):
    return q_unrolled(h, v, iters + 1, alpha)


def q_cg(h, v, iters, damping=0.0):
    hd = h + damping * torch.eye(len(v), dtype=F64)
    basis = krylov_basis(hd, v, iters)
    return basis @ torch.linalg.solve(basis.T @ hd @ basis, basis.T @ v)


# --- Q: quadratic bilevel ------------------------------------------------------------------

class Quadratic:
    """Inner ½wᵀAw − (Bλ)ᵀw, outer ½‖Cw − e‖² + ½ρ‖λ‖², w at w* = A⁻¹Bλ."""

    def __init__(self, seed, d=5, m=3, p=4, rho=0.3, a=None):
        g = gen(seed)
        self.A = spd(g, d) if a is None else a
        self.B, self.C = randn(g, d, m), randn(g, p, d)
        self.e, self.lam0, self.rho = randn(g, p), randn(g, m), rho

    def solve(self, lam):
        return torch.linalg.solve(self.A, self.B @ lam)

    def outer(self, w, lam):
        return 0.5 * ((self.C @ w - self.e) ** 2).sum() + 0.5 * self.rho * (lam ** 2).sum()

    def v(self):
        return self.C.T @ (self.C @ self.solve(self.lam0) - self.e)

    def exact(self):
        return self.rho * self.lam0 + self.B.T @ torch.linalg.solve(self.A, self.v())

    def with_q(self, q):
        """Hypergradient for a method whose solve returns q: ρλ + Bᵀq (J = -B)."""
        return self.rho * self.lam0 + self.B.T @ q

    def program(self, method, optimizer=None, semantics="per_edge"):
        w, lam = leaf(self.solve(self.lam0)), leaf(self.lam0)
        inner = Problem("w", (w,), lambda w, l: 0.5 * w[0] @ self.A @ w[0]
                        - (self.B @ l[0]) @ w[0], ("w", "lam"), optimizer or sgd(0.1))
        outer = Problem("lam", (lam,), lambda w, l: self.outer(w[0], l[0]), ("w", "lam"))
        return hierarchy([inner, outer], [Edge("lam", "w", method)], semantics), lam


# --- R: ridge regression with per-feature penalties e^λ ------------------------------------

class Ridge:
    """Train ½‖Xw − y‖²/n + ½Σ e^{λ_j} w_j², validate ½‖X_v w − y_v‖²/n_v."""

    def __init__(self, seed, n=30, d=6):
        g = gen(seed)
        self.X, self.y = randn(g, n, d), randn(g, n)
        self.Xv, self.yv = randn(g, n, d), randn(g, n)
        self.lam0 = 0.5 * randn(g, d)

    def hessian(self, lam):
        return self.X.T @ self.X / len(self.y) + torch.diag(torch.exp(lam))

    def solve(self, lam):
        return torch.linalg.solve(self.hessian(lam), self.X.T @ self.y / len(self.y))

    def outer(self, w):
        return 0.5 * ((self.Xv @ w - self.yv) ** 2).sum() / len(self.yv)

    def v(self):
        return self.Xv.T @ (self.Xv @ self.solve(self.lam0) - self.yv) / len(self.yv)

    def exact(self):
        w = self.solve(self.lam0)
        return -torch.exp(self.lam0) * w * torch.linalg.solve(self.hessian(self.lam0), self.v())

    def with_q(self, q):
        return -torch.exp(self.lam0) * self.solve(self.lam0) * q

    def inner(self, w, lam):
        return (0.5 * ((self.X @ w - self.y) ** 2).sum() / len(self.y)
                + 0.5 * (torch.exp(lam) * w * w).sum())

    def program(self, method, optimizer=None):
        w, lam = leaf(self.solve(self.lam0)), leaf(self.lam0)
        inner = Problem("w", (w,), lambda w, l: self.inner(w[0], l[0]), ("w", "lam"),
                        optimizer or sgd(0.2))
        outer = Problem("lam", (lam,), lambda w: self.outer(w[0]), ("w",))
        return hierarchy([inner, outer], [Edge("lam", "w", method)]), lam
