"""An independent float64 reference for Shampoo's preconditioned direction: explicit loops
over blocks, ``torch.linalg.eigh`` roots, the ridge from the exact ``λmax``. Nothing here
imports mloc's roots or blocks."""

from __future__ import annotations

import torch

F64 = torch.float64


def eig_root(a: torch.Tensor, p: int, eps: float) -> torch.Tensor:
    """``(A + eps·λmax(A)·I)^{-1/p}`` by eigendecomposition."""
    lam, v = torch.linalg.eigh(a)
    lam = lam + eps * lam[-1]
    return (v * lam.pow(-1.0 / p)) @ v.T


def blockwise_direction(g_hist: list[torch.Tensor], b: int, eps: float, p: int = 4) -> torch.Tensor:
    """For a matrix parameter, the unscaled Shampoo direction of the last gradient of
    ``g_hist`` with running-sum statistics of all of them, the matrix split into b×b
    blocks (the last ones smaller, no padding), each block its own ``L, R``."""
    g = g_hist[-1]
    out = torch.zeros_like(g)
    m, n = g.shape
    for i in range(0, m, b):
        for j in range(0, n, b):
            L = sum(h[i:i + b, j:j + b] @ h[i:i + b, j:j + b].T for h in g_hist)
            R = sum(h[i:i + b, j:j + b].T @ h[i:i + b, j:j + b] for h in g_hist)
            out[i:i + b, j:j + b] = eig_root(L, p, eps) @ g[i:i + b, j:j + b] @ eig_root(R, p, eps)
    return out
