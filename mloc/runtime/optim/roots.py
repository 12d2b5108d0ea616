r"""Inverse p-th roots of symmetric positive semidefinite matrices, batched, for Shampoo.

Given a batch of statistics ``S`` (``(..., n, n)``, symmetric PSD) this computes
``(S + r·I)^{-1/p}`` with the **relative ridge** ``r = ε·λmax(S)`` added to a copy (the
stored statistics are never modified). ``λmax`` comes from the power method by repeated
squaring from a fixed vector, run until it has converged (:func:`max_eigenvalue`: to
rounding, or within ``1e3·eps`` relative when the top two eigenvalues are that close; no
random number generator is read, so two runs, two processes or two ranks compute the
same ridge, and Newton's ridge is eigh's).

Coupled Newton iteration (Guo & Higham, "A Schur–Newton method for the matrix p-th root
and its inverse", SIAM J. Matrix Anal. Appl. 28(3), 2006), as in the reference
``scalable_shampoo`` (Anil et al., "Scalable Second Order Optimization for Deep
Learning", 2020):

.. math::
    z = \frac{1+p}{2\|A\|_F},\quad X_0 = z^{1/p} I,\quad M_0 = z A,\qquad
    T_k = \frac{(p+1)I - M_k}{p},\quad X_{k+1} = X_k T_k,\quad M_{k+1} = T_k^p M_k

with the invariant ``M_k = X_k^p A``; ``M_k → I`` and ``X_k → A^{-1/p}``. Each matrix of
the batch stops on its own when ``max|M − I| < tol`` or when its error grows by more than
×1.2 over the previous iterate (the *divergence guard*: the previous iterate is kept),
or after ``max_iters``. The guard is armed once the error is below 0.1: the first
iterations are not monotone in ``max|M − I|`` (a 6×6 Shampoo statistic with eigenvalues
0.02…1.1 goes 0.61 → 0.73 → 0.55 → … → 4e-16), and a guard armed from the start stops
there with a rejected root. Before that, only a non-finite iterate stops it; a converged matrix is frozen while the others continue, so a
matrix's root does not depend on what it is batched with.

The eigendecomposition alternative (``method="eigh"``) computes ``S = V diag(λ) Vᵀ`` once
and the root as ``V diag((max(λ, 0) + ε·λmax)^{-1/p}) Vᵀ`` with ``λmax`` its largest
eigenvalue (the ridge shifts every eigenvalue by the same amount, so no power iteration is
needed and the ridge is exact). The clamp at 0: a statistic is PSD by construction, so a
negative eigenvalue is rounding. It matters for singular statistics (a softmax layer's
output-side statistic is: its gradient's columns sum to zero), whose float32 running sums
drift to negative eigenvalues (below ``−1e-6·λmax`` after 700–1,400 steps of one repeated
gradient on ``bench/shampoo.py``'s logistic regression); unclamped, one below ``−ε·λmax``
would reject every later root. ``method="auto"`` (:func:`resolve`) is ``eigh`` on the CPU and ``newton``
elsewhere: on a CPU LAPACK's eigendecomposition of a 128×128 matrix costs about eight
matrix products (~1.4 ms in float64 on one core), the ~20 Newton iterations about eighty;
on an accelerator the matrix products are cheap and batched ``eigh`` is not.

Acceptance: a root is **rejected** (``ok`` false for that matrix) when the input, the ridge
or the root is not finite, or its final error ``max|M − I|`` exceeds ``error_tolerance``
(for ``eigh``: when a clamped, ridged eigenvalue is not positive, i.e. a zero statistic,
or a singular one with ``ε = 0``). The caller keeps its previous root for a rejected
matrix and counts consecutive failures; a NaN or Inf never leaves this module inside an accepted root.

Numbers are computed in ``compute_dtype`` (float64 by default: cheap on the CPU for
Shampoo's block sizes, and what lets a float32 model reach a 1e-4-accurate root at
condition number 1e6) and cast back to the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mloc.shared.hyper import ROOT_ALGORITHMS

METHODS = ROOT_ALGORITHMS
"""The root algorithms; ``"auto"`` is resolved to one of them per device (:func:`resolve`)."""
GUARD_ARMED_BELOW = 0.1
"""The divergence guard acts once ``max|M − I|`` is below this (see the module docstring)."""


@dataclass(frozen=True)
class Roots:
    """A batch of inverse roots: ``root`` (``(..., n, n)``, the input's dtype), ``ok``
    (``(...)`` bool: accepted), ``error`` (``(...)``: the final ``max|M − I|``, 0 for
    ``eigh``), ``iters`` (Newton iterations the slowest matrix took; 0 for ``eigh``) and
    ``all_ok`` (known without reading ``ok``: every root accepted; ``False`` means unknown)."""

    root: Tensor
    ok: Tensor
    error: Tensor
    iters: int
    all_ok: bool = False


def _start_vector(n: int, dtype, device) -> Tensor:
    """A fixed, generic unit vector (not ``1/√n``: that one is orthogonal to the top
    eigenvector of many structured matrices)."""
    v = 1.0 + torch.arange(n, dtype=dtype, device=device).mul_(0.6180339887498949).remainder_(1.0)
    return v / torch.linalg.vector_norm(v)


def max_eigenvalue(a: Tensor, squarings: int = 64, tol: float | None = None) -> Tensor:
    r"""``λmax`` of each symmetric PSD matrix of the batch ``a`` (``(..., n, n)`` → ``(...)``),
    converged: the power method by repeated squaring.

    With ``B₀ = A/‖A‖_F`` and ``B_{k+1} = B_k²/‖B_k²‖_F`` (so ``B_k ∝ A^N``, ``N = 2^k``,
    that neither overflows nor underflows), ``v = B_k u`` for a fixed start ``u`` and
    ``λ = vᵀAv / vᵀv``. In the eigenbasis the weight of ``λᵢ`` in ``v`` is
    ``cᵢ (λᵢ/λmax)^N``: ``k`` squarings are ``2^k`` steps of the power method for the
    price of ``k`` matrix products, so a top pair ``λ₂ = (1−δ)λmax`` separates after about
    ``log₂(37/δ)`` of them, where the plain power iteration needs ``~37/δ`` matrix-vector
    products (it stopped on a 1e-6 relative change and was up to ``δ`` off: 1e-2 on
    rank-deficient 32×32 statistics with ``δ = 1e-2``).

    Stopping: a matrix stops (and is frozen: its value does not depend on what it is
    batched with) once ``‖B_{k+1} − B_k‖_F ≤ tol`` (default: ``1e3·eps`` of the dtype).
    That test is safe where a test on ``λ`` is not: while a top pair is not yet separated
    (``Nδ ≪ 1``) ``B`` still moves by about ``Nδ`` per squaring, whereas ``λ``'s error,
    at most ``δ·λmax``, changes by only ``~Nδ²``; so ``B`` stands still only once the pair
    has separated (``λ`` exact to rounding) or ``δ ≲ tol`` (``λ`` within ``tol·λmax``).
    The Rayleigh quotient is second order in ``v``'s error, so rounding in ``B_k`` costs
    nothing visible. ``squarings`` bounds the work (64: ``N = 2^64``). No random number
    generator is read (the start vector is fixed: two runs, processes or ranks agree)."""
    tol = 1e3 * torch.finfo(a.dtype).eps if tol is None else tol
    tiny = torch.finfo(a.dtype).tiny
    b = a / torch.linalg.matrix_norm(a).clamp_min(tiny)[..., None, None]
    active = torch.ones(a.shape[:-2], dtype=torch.bool, device=a.device)
    for _ in range(squarings):
        sq = b @ b
        sq = sq / torch.linalg.matrix_norm(sq).clamp_min(tiny)[..., None, None]
        moved = torch.linalg.matrix_norm(sq - b) > tol
        b = torch.where(active[..., None, None], sq, b)
        active = active & moved
        if not bool(active.any()):
            break
    v = b @ _start_vector(a.shape[-1], a.dtype, a.device).expand(*a.shape[:-1]).unsqueeze(-1)
    return ((v * (a @ v)).sum((-2, -1)) / (v * v).sum((-2, -1)).clamp_min(tiny))


def ridged(stats: Tensor, epsilon: float, dtype=torch.float64) -> tuple[Tensor, Tensor]:
    """``(S + ε·λmax(S)·I, λmax)`` in ``dtype``: a new tensor; ``stats`` is not touched."""
    a = stats.to(dtype).clone()
    a = 0.5 * (a + a.transpose(-2, -1))        # symmetric to the last bit
    lam = max_eigenvalue(a)
    eye = torch.eye(a.shape[-1], dtype=dtype, device=a.device)
    return a + (epsilon * lam)[..., None, None] * eye, lam


def _newton(a: Tensor, p: int, tol: float, max_iters: int) -> tuple[Tensor, Tensor, int]:
    """Coupled Newton for ``a^{-1/p}`` (batched, see the module docstring): ``(X, error, iters)``."""
    n = a.shape[-1]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    z = (1 + p) / (2 * torch.linalg.matrix_norm(a))                  # (...)
    x = z.pow(1.0 / p)[..., None, None] * eye
    m = z[..., None, None] * a
    err = (m - eye).abs().amax((-2, -1))
    active = err >= tol
    it = 0
    while it < max_iters and bool(active.any()):
        t = ((p + 1) * eye - m) / p
        x_new = x @ t
        m_new = torch.linalg.matrix_power(t, p) @ m
        err_new = (m_new - eye).abs().amax((-2, -1))
        step = active & torch.isfinite(err_new) & ((err_new <= 1.2 * err) | (err > GUARD_ARMED_BELOW))
        if bool(step.all()):             # the common case: no masking needed
            x, m, err = x_new, m_new, err_new
        else:
            s = step[..., None, None]
            x, m = torch.where(s, x_new, x), torch.where(s, m_new, m)
            err = torch.where(step, err_new, err)
        active = step & (err >= tol)     # a matrix that would diverge keeps its iterate and stops
        it += 1
    return x, err, it


def _eigh_raw(a: Tensor, p: int, epsilon: float) -> tuple[Tensor, Tensor]:
    """``(V diag(s^{-1/p}) Vᵀ, s)`` with ``s = max(λ, 0) + ε·max(λmax, 0)`` the ridged
    eigenvalues of ``a`` (ascending; clamped to the smallest positive normal number before
    the power). Raises ``LinAlgError`` when LAPACK does not converge."""
    lam, v = torch.linalg.eigh(a)
    lam = lam.clamp_min(0)              # rounding's negative eigenvalues (module docstring)
    shifted = torch.add(lam, lam[..., -1:], alpha=epsilon) if epsilon else lam
    scale = shifted.clamp_min(torch.finfo(a.dtype).tiny).pow(-1.0 / p)
    return torch.matmul(v * scale.unsqueeze(-2), v.transpose(-2, -1)), shifted


def _eigh_roots(stats: Tensor, p: int, epsilon: float, compute_dtype) -> Roots:
    """:func:`inverse_root` by one eigendecomposition (LAPACK reads the lower triangle: no
    symmetrizing). The common case costs one check (one host read): every input, root and
    ridged eigenvalue finite and positive, all accepted. Otherwise per matrix: a non-finite
    input is zeroed and the decomposition redone without it (LAPACK fails on a NaN), a
    non-positive ridged eigenvalue rejects its matrix, a LAPACK failure the whole batch."""
    shape = stats.shape[:-2]
    err = torch.zeros(shape, dtype=compute_dtype, device=stats.device)
    try:
        x, shifted = _eigh_raw(stats.to(compute_dtype, copy=False), p, epsilon)
        root = x.to(stats.dtype)
    except torch.linalg.LinAlgError:
        root = shifted = None
    if root is not None and bool(_finite(root.sum() + stats.sum()) & (shifted[..., 0].amin() > 0)):
        return Roots(root, torch.ones(shape, dtype=torch.bool, device=stats.device), err, 0, all_ok=True)
    finite_in, clean = _cleaned(stats)
    if clean is not stats:                   # redone without the non-finite matrices
        try:
            x, shifted = _eigh_raw(clean.to(compute_dtype, copy=False), p, epsilon)
            root = x.to(stats.dtype)
        except torch.linalg.LinAlgError:
            root = None
    if root is None:                         # LAPACK did not converge: reject the whole batch
        return _accepted(torch.zeros_like(stats), torch.zeros(shape, dtype=torch.bool, device=stats.device),
                         err, 0)
    return _accepted(root, finite_in & (shifted[..., 0] > 0), err, 0)


def _cleaned(stats: Tensor) -> tuple[Tensor, Tensor]:
    """``(finite, clean)``: which matrices are finite (a NaN or Inf makes the sum non-finite;
    one whose sum overflows counts as non-finite too), and ``stats`` itself when all are,
    else a copy with the others zeroed."""
    finite_in = _finite(stats.sum((-2, -1)))
    if bool(finite_in.all()):
        return finite_in, stats
    return finite_in, torch.where(finite_in[..., None, None], stats,
                                  torch.zeros((), dtype=stats.dtype, device=stats.device))


def _accepted(root: Tensor, ok: Tensor, error: Tensor, iters: int) -> Roots:
    """``Roots`` with ``ok`` narrowed to finite roots, and a rejected root zeros, never NaN
    or Inf."""
    ok = ok & _finite(root.sum((-2, -1)))
    if not bool(ok.all()):
        root = torch.where(ok[..., None, None], root, torch.zeros((), dtype=root.dtype, device=root.device))
    return Roots(root, ok, error, iters)


def resolve(method: str, device: torch.device) -> str:
    """The root algorithm for ``method`` on ``device``: ``"auto"`` is ``"eigh"`` on the CPU
    and ``"newton"`` elsewhere (see the module docstring); others are themselves."""
    if method == "auto":
        return "eigh" if device.type == "cpu" else "newton"
    if method not in METHODS:
        raise ValueError(f"unknown root method {method!r}; expected 'auto' or one of {METHODS}")
    return method


def inverse_root(stats: Tensor, p: int, *, epsilon: float = 1e-6, method: str = "newton",
                 tol: float | None = None, max_iters: int = 100, error_tolerance: float = 0.1,
                 compute_dtype=torch.float64) -> Roots:
    """``(S + ε·λmax(S)·I)^{-1/p}`` for each matrix of the batch ``stats`` (see the module
    docstring); ``epsilon = 0`` computes the root of ``S`` itself. ``tol`` defaults to
    :func:`default_tol` of ``compute_dtype``."""
    tol = default_tol(compute_dtype) if tol is None else tol
    method = resolve(method, stats.device)
    if method == "eigh":
        return _eigh_roots(stats, p, epsilon, compute_dtype)
    finite_in, clean = _cleaned(stats)
    a = ridged(clean, epsilon, compute_dtype)[0] if epsilon else 0.5 * (
        clean.to(compute_dtype) + clean.to(compute_dtype).transpose(-2, -1))
    x, err, iters = _newton(a, p, tol, max_iters)
    return _accepted(x.to(stats.dtype), (err <= error_tolerance) & finite_in, err, iters)


def _finite(x: Tensor) -> Tensor:
    """``isfinite`` in two operations (``x·0`` is 0 for a finite ``x``, NaN otherwise)."""
    return (x * 0) == 0


def default_tol(dtype) -> float:
    """Newton's stopping tolerance on ``max|M − I|``: 1e-10 in float64 (one or two
    iterations more than the reference's 1e-6, and a root accurate to ~1e-11 relative at
    condition number 1e6), 1e-6 in lower precisions (what they can reach)."""
    return 1e-10 if dtype == torch.float64 else 1e-6

