"""Oracle S: Q's quadratic bilevel problem with an indefinite lower Hessian, for
`mloc hypergrad --check`'s verdict. Inner ½wᵀAw − (Bλ)ᵀw with A = U diag(−2, 1, 3, 5, 7, 9) Uᵀ:
w* = A⁻¹Bλ is a stationary point (a saddle), not a minimum, so CG on A v = b is no
reference. The closed form of the lower Hessian is A: its eigenvalues are exactly those."""

from __future__ import annotations

import torch

from oracles import D, Vector

EIGENVALUES = (-2.0, 1.0, 3.0, 5.0, 7.0, 9.0)


class S:
    def __init__(self, seed: int = 0, m: int = 3, p: int = 4):
        g = torch.Generator().manual_seed(seed)
        u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=D))
        self.A = u @ torch.diag(torch.tensor(EIGENVALUES, dtype=D)) @ u.T
        self.B = torch.randn(6, m, generator=g, dtype=D)
        self.C = torch.randn(p, 6, generator=g, dtype=D)
        self.dv = torch.randn(p, generator=g, dtype=D)
        self.lam0 = torch.randn(m, generator=g, dtype=D)


def s_lower(seed: int = 0):
    s = S(seed)
    return Vector(torch.linalg.solve(s.A, s.B @ s.lam0))


def s_upper(seed: int = 0):
    return Vector(S(seed).lam0)


def s_inner(w, lam, batch, seed: int = 0):
    s = S(seed)
    return 0.5 * w.v @ s.A @ w.v - (s.B @ lam.v) @ w.v


def s_outer(w, lam, batch, seed: int = 0):
    s = S(seed)
    r = s.C @ w.v - s.dv
    return 0.5 * r @ r + 0.05 * lam.v @ lam.v
