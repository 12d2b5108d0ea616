"""Oracles Q and T (shared/reference/hypergradients.md) as ordinary Python modules for
`.mlo` programs: parameters start at the exact solutions, so the hypergradient mloc
computes at the initial state can be compared with the closed forms (float64)."""

from __future__ import annotations

import torch
from torch import nn

D = torch.float64


def _spd(n: int, g: torch.Generator, cond: float = 10.0) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=D))
    return q @ torch.diag(torch.linspace(1.0, cond, n, dtype=D)) @ q.T


class Q:
    """Inner ½wᵀAw − (Bλ)ᵀw; outer ½‖Cw − d‖² + ½ρ‖λ‖²."""

    def __init__(self, seed: int = 0, d: int = 6, m: int = 3, p: int = 4, rho: float = 0.1):
        g = torch.Generator().manual_seed(seed)
        self.A = _spd(d, g)
        self.B = torch.randn(d, m, generator=g, dtype=D)
        self.C = torch.randn(p, d, generator=g, dtype=D)
        self.dv = torch.randn(p, generator=g, dtype=D)
        self.lam0 = torch.randn(m, generator=g, dtype=D)
        self.rho = rho

    def w_star(self, lam):
        return torch.linalg.solve(self.A, self.B @ lam)

    def exact(self):
        w = self.w_star(self.lam0)
        return self.rho * self.lam0 + self.B.T @ torch.linalg.solve(self.A, self.C.T @ (self.C @ w - self.dv))


class T:
    """Bottom w, middle x (reads w: feedback), top λ."""

    def __init__(self, seed: int = 0, dw: int = 5, dx: int = 4, m: int = 3, rho: float = 0.1):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=D)  # noqa: E731
        self.A1, self.B1, self.c1 = _spd(dw, g), r(dw, dx), r(dw)
        self.A2, self.B2, self.c2 = _spd(dx, g), r(dx, m), r(dx)
        self.C2, self.E2, self.e2 = r(3, dw), r(3, dx), r(3)
        self.C3, self.e3 = r(2, dx), r(2)
        self.lam0, self.rho = r(m), rho
        self.G = self.C2 @ torch.linalg.solve(self.A1, self.B1) + self.E2

    def w_star(self, x):
        return torch.linalg.solve(self.A1, self.B1 @ x + self.c1)

    def x_star(self, lam):
        k = self.C2 @ torch.linalg.solve(self.A1, self.c1) - self.e2
        return torch.linalg.solve(self.A2 + self.G.T @ self.G, self.B2 @ lam + self.c2 - self.G.T @ k)

    def exact(self):
        x = self.x_star(self.lam0)
        return self.rho * self.lam0 + self.B2.T @ torch.linalg.solve(self.A2 + self.G.T @ self.G,
                                                                     self.C3.T @ (self.C3 @ x - self.e3))

    def per_edge(self):
        x = self.x_star(self.lam0)
        return self.rho * self.lam0 + self.B2.T @ torch.linalg.solve(self.A2 + self.E2.T @ self.E2,
                                                                     self.C3.T @ (self.C3 @ x - self.e3))


class Vector(nn.Module):
    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.v = nn.Parameter(value.clone())


def q_lower(seed: int = 0):
    q = Q(seed)
    return Vector(q.w_star(q.lam0))


def q_upper(seed: int = 0):
    return Vector(Q(seed).lam0)


def t_bottom(seed: int = 0):
    t = T(seed)
    return Vector(t.w_star(t.x_star(t.lam0)))


def t_middle(seed: int = 0):
    t = T(seed)
    return Vector(t.x_star(t.lam0))


def t_top(seed: int = 0):
    return Vector(T(seed).lam0)


def nothing():
    return [torch.zeros(1, dtype=D)]


def q_inner(w, lam, batch, seed: int = 0):
    q = Q(seed)
    return 0.5 * w.v @ q.A @ w.v - (q.B @ lam.v) @ w.v


def q_outer(w, lam, batch, seed: int = 0):
    q = Q(seed)
    r = q.C @ w.v - q.dv
    return 0.5 * r @ r + 0.5 * q.rho * lam.v @ lam.v


def t_bottom_loss(w, x, batch, seed: int = 0):
    t = T(seed)
    return 0.5 * w.v @ t.A1 @ w.v - w.v @ (t.B1 @ x.v + t.c1)


def t_middle_loss(x, w, lam, batch, seed: int = 0):
    t = T(seed)
    r = t.C2 @ w.v + t.E2 @ x.v - t.e2
    return 0.5 * x.v @ t.A2 @ x.v - x.v @ (t.B2 @ lam.v + t.c2) + 0.5 * r @ r


def t_top_loss(x, lam, batch, seed: int = 0):
    t = T(seed)
    r = t.C3 @ x.v - t.e3
    return 0.5 * r @ r + 0.5 * t.rho * lam.v @ lam.v
