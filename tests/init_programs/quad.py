"""A quadratic bilevel problem for `init` × method × unroll closed-form tests (float64).

Upper `meta`: φ ∈ R^3. Lower `task`: θ ∈ R^3 (with `init = meta`, θ = φ + δ and the lower
trains δ). Losses, every constant fixed here and read by the test through `constants()`:

    lower  L(θ, φ) = ½(θ − a)ᵀA(θ − a) + (λ/2)‖θ − φ‖²      (`proximal`: reads `meta`)
    lower  L(θ)    = ½(θ − a)ᵀA(θ − a)                      (`plain`: MAML, reads `init` only)
    upper  F(θ)    = ½‖θ − b‖²

The data stream is one dummy batch that no loss reads.
"""

from __future__ import annotations

import torch
from torch import nn

D = torch.float64
DIM = 3


def constants() -> dict[str, torch.Tensor]:
    """A (SPD, eigenvalues 1, 2.5, 4), a, b, λ, the initial φ and θ: small exact decimals."""
    q, _ = torch.linalg.qr(torch.tensor([[2.0, -1.0, 0.5], [1.0, 3.0, -2.0], [0.0, 1.0, 1.5]], dtype=D))
    return {
        "A": q @ torch.diag(torch.tensor([1.0, 2.5, 4.0], dtype=D)) @ q.T,
        "a": torch.tensor([1.0, -2.0, 0.5], dtype=D),
        "b": torch.tensor([-0.5, 1.5, 2.0], dtype=D),
        "lam": torch.tensor(1.5, dtype=D),
        "phi0": torch.tensor([0.3, 0.7, -1.2], dtype=D),
        "theta0": torch.tensor([-1.0, 0.25, 2.0], dtype=D),
    }


class Vector(nn.Module):
    def __init__(self, start: str):
        super().__init__()
        self.v = nn.Parameter(constants()[start].clone())


def nothing():
    return [torch.zeros(1, dtype=D)]


def proximal(task, meta, batch):
    c = constants()
    r = task.v - c["a"]
    return 0.5 * r @ c["A"] @ r + 0.5 * c["lam"] * (task.v - meta.v) @ (task.v - meta.v)


def plain(task, batch):
    c = constants()
    r = task.v - c["a"]
    return 0.5 * r @ c["A"] @ r


def outer(task, batch):
    r = task.v - constants()["b"]
    return 0.5 * r @ r
