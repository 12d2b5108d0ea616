"""Newton's roots and eigh's agree on Shampoo's usual statistics: rank-deficient, with a
relative ridge ε·λmax that dominates the null space, and a top pair of eigenvalues that may
be close (docs/shampoo.md, "Inverse p-th root").

The ridge is the one place the two methods can differ beyond Newton's own tolerance: eigh
reads λmax off its eigendecomposition, Newton from :func:`max_eigenvalue`. On a zero
eigenvalue the root is ``(ε·λmax)^{-1/p}``, so a relative error ``e`` in λmax moves the
root by ``e/p`` there. The power iteration this replaced stopped on a 1e-6 relative change
and was off by up to the relative gap ``δ`` of the top pair (1e-2 at ``δ = 1e-2``, roots
2.5e-3 apart); by repeated squaring it converges: λmax to 1e-13 relative here (measured
≤ 1.4e-15), the roots to 1e-10 (measured ≤ 3e-11: Newton's tolerance 1e-10 on max|M − I|),
float64.
"""

from __future__ import annotations

import pytest
import torch

from mloc.runtime.optim.roots import inverse_root, max_eigenvalue

F64 = torch.float64
GAPS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-6, 1e-9, 0.0)


def statistic(gap: float, seed: int, n: int = 32, rank: int = 12) -> torch.Tensor:
    """A batch of 3 PSD n×n matrices of rank ``rank``: eigenvalues 1, 1 − gap, then ten
    log-spaced from 1e-1 to 1e-4, the rest 0; random orthogonal eigenvectors."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, n, n, generator=gen, dtype=F64))
    lam = torch.zeros(n, dtype=F64)
    lam[:rank] = torch.cat([torch.tensor([1.0, 1.0 - gap], dtype=F64),
                            torch.logspace(-1, -4, rank - 2, dtype=F64)])
    a = (q * lam) @ q.transpose(-2, -1)
    return 2.5 * 0.5 * (a + a.transpose(-2, -1))


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.matrix_norm(x - ref) / torch.linalg.matrix_norm(ref)).max().item()


@pytest.mark.parametrize("gap", GAPS)
def test_max_eigenvalue_converges_when_the_top_pair_is_close(gap):
    a = statistic(gap, seed=round(gap * 1e9) % 1000)
    true = torch.linalg.eigvalsh(a)[..., -1]
    got = max_eigenvalue(a)
    assert ((got - true).abs() / true).max().item() <= 1e-13


@pytest.mark.parametrize("gap", GAPS)
@pytest.mark.parametrize("p", (2, 4, 8))
def test_newton_and_eigh_agree_on_rank_deficient_ridged_statistics(gap, p):
    a = statistic(gap, seed=p + round(gap * 1e9) % 1000)
    newton = inverse_root(a, p, epsilon=1e-6, method="newton")
    eigh = inverse_root(a, p, epsilon=1e-6, method="eigh")
    assert bool(newton.ok.all()) and bool(eigh.ok.all())
    assert rel_err(newton.root, eigh.root) <= 1e-10


def test_a_statistic_of_gradients_with_a_repeated_top_direction():
    """G Gᵀ of a 16×4 gradient whose two strongest columns are nearly equal in norm and
    orthogonal (rank 4 of 16: the output side of a small layer): Newton = eigh to 1e-10."""
    gen = torch.Generator().manual_seed(5)
    q, _ = torch.linalg.qr(torch.randn(16, 4, generator=gen, dtype=F64))
    g = q * torch.tensor([3.0, 3.0 * (1 - 3e-4), 1.0, 0.2], dtype=F64)
    s = (g @ g.T)[None]
    newton = inverse_root(s, 4, epsilon=1e-6, method="newton")
    eigh = inverse_root(s, 4, epsilon=1e-6, method="eigh")
    assert rel_err(newton.root, eigh.root) <= 1e-10
