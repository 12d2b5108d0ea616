r"""How Shampoo lays out one parameter tensor: merged dims, equal-shaped blocks, a policy.

For a parameter of shape ``(d₁, …, d_r)``:

1. **Merge** adjacent dims while their product stays ≤ ``block_size``, dropping dims of
   size 1 (``merge_small_dims`` of the reference ``scalable_shampoo``): a conv kernel
   ``(64, 3, 3, 3)`` with block size 128 becomes ``(64, 27)``. Unlike the reference, a
   tensor of two or more dims is never merged into a vector (``(20, 3)`` stays a matrix,
   ``(4, 4, 4)`` becomes ``(4, 16)``), so small matrices are still preconditioned.
2. **Policy**: a tensor left with fewer than two dims (biases, norms' scales, scalars) or
   with a merged dim above ``max_precond_dim`` is updated by the grafted optimizer's
   diagonal direction alone (``"diagonal"``); every other tensor is preconditioned
   (``"shampoo"``) along every merged dim, with root order ``p = 2k`` for ``k`` merged dims
   (exponent ``−1/(2k)``) unless overridden.
3. **Block**: a merged dim ``d > block_size`` is zero-padded to a multiple of
   ``block_size`` and split into blocks of that size; a dim ``≤ block_size`` is one block.
   All blocks of a tensor thus have the same shape ``(b₁, …, b_k)`` and their statistics
   and roots are batched (``(B, bᵢ, bᵢ)`` per mode). Padding is exact: the padded rows of a
   block's gradient are zero, so its statistic is ``diag(S, 0)``, whose ridged root is
   block-diagonal and maps the zero rows to zero; the real rows see the root of ``S`` with
   the same ridge (``λmax`` is unchanged by the zeros).

``to_blocks``/``from_blocks`` convert between the tensor and its ``(B, b₁, …, b_k)`` blocks;
``mode_stats`` and ``precondition`` apply one matrix per mode by rotating the modes through
position 1 (after ``k`` rotations the block is back in its layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def merge_small_dims(shape: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """Adjacent dims merged while the product is ≤ ``block_size``; dims of size 1 dropped."""
    out, product = [], 1
    for d in shape:
        if product * d <= block_size:
            product *= d
        else:
            if product > 1:
                out.append(product)
            product = d
    if product > 1:
        out.append(product)
    return tuple(out)


def merge_dims(shape: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """:func:`merge_small_dims`, except that a tensor with two or more dims (of size > 1)
    keeps two: then its first dim and the merge of the rest (a 20×3 matrix stays 20×3, it
    does not become a 60-vector)."""
    squeezed = tuple(d for d in shape if d > 1)
    merged = merge_small_dims(squeezed, block_size)
    if len(merged) >= 2 or len(squeezed) < 2:
        return merged
    return (squeezed[0], *merge_small_dims(squeezed[1:], block_size))


@dataclass(frozen=True)
class Layout:
    """A parameter's layout (see the module docstring). ``policy`` is ``"shampoo"`` or
    ``"diagonal"``; for ``"shampoo"``: ``merged`` dims, ``block`` shape, ``grid`` (blocks per
    dim) and the root order ``p``."""

    shape: tuple[int, ...]
    policy: str
    merged: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    grid: tuple[int, ...] = ()
    p: int = 0

    @property
    def count(self) -> int:
        """Number of blocks ``B``."""
        return math.prod(self.grid)

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(b * n for b, n in zip(self.block, self.grid))


def layout(shape: tuple[int, ...], block_size: int, max_precond_dim: int, p_override: int = 0) -> Layout:
    merged = merge_dims(tuple(shape), block_size)
    if len(merged) < 2 or max(merged) > max_precond_dim:
        return Layout(tuple(shape), "diagonal")
    block = tuple(min(d, block_size) for d in merged)
    grid = tuple(-(-d // b) for d, b in zip(merged, block))
    return Layout(tuple(shape), "shampoo", merged, block, grid, p_override or 2 * len(merged))


def to_blocks(x: Tensor, lay: Layout) -> Tensor:
    """``x`` (the parameter's shape) as ``(B, b₁, …, b_k)`` blocks (zero-padded)."""
    if lay.count == 1:                  # one block, no padding: a view
        return x.reshape(1, *lay.block)
    x = x.reshape(lay.merged)
    pad = [p - d for p, d in zip(lay.padded, lay.merged)]
    if any(pad):
        x = torch.nn.functional.pad(x, [v for q in reversed(pad) for v in (0, q)])
    k = len(lay.block)
    x = x.reshape([v for n, b in zip(lay.grid, lay.block) for v in (n, b)])
    x = x.permute(*range(0, 2 * k, 2), *range(1, 2 * k, 2))
    return x.reshape(lay.count, *lay.block)


def from_blocks(x: Tensor, lay: Layout) -> Tensor:
    """The inverse of :func:`to_blocks` (padding dropped)."""
    if lay.count == 1:
        return x.reshape(lay.shape)
    k = len(lay.block)
    x = x.reshape(*lay.grid, *lay.block)
    x = x.permute([v for i in range(k) for v in (i, k + i)]).reshape(lay.padded)
    if lay.padded != lay.merged:
        x = x[tuple(slice(0, d) for d in lay.merged)]
    return x.reshape(lay.shape)


def mode_stats(x: Tensor) -> list[Tensor]:
    """Per mode ``i`` of the blocks ``x`` (``(B, b₁, …, b_k)``), ``X₍ᵢ₎X₍ᵢ₎ᵀ`` (``(B, bᵢ, bᵢ)``),
    ``X₍ᵢ₎`` the mode-``i`` unfolding."""
    out = []
    for _ in range(x.dim() - 1):
        u = x.reshape(x.shape[0], x.shape[1], -1)
        out.append(u @ u.transpose(-2, -1))
        x = x.movedim(1, -1)
    return out


def accumulate(stats, x: Tensor, beta: float, inplace: bool = False) -> tuple[Tensor, ...]:
    """Per mode, ``β·S + w·X₍ᵢ₎X₍ᵢ₎ᵀ`` (``w = 1`` for ``β = 1``, a running sum, else ``1−β``)
    for the statistics ``stats`` of the blocks ``x`` (:func:`mode_stats`' products). Matrix
    blocks take one fused ``baddbmm`` per mode (``X Xᵀ`` and ``Xᵀ X``, no transposed copy),
    the same kernel in place (``inplace``: ``stats`` are overwritten and returned) or not,
    so the two agree bit for bit."""
    w = 1.0 if beta == 1 else 1 - beta
    if x.dim() == 3:
        xt = x.transpose(-2, -1)
        pairs = ((stats[0], x, xt), (stats[1], xt, x))
        if inplace:
            return tuple(s.baddbmm_(a, b, beta=beta, alpha=w) for s, a, b in pairs)
        return tuple(torch.baddbmm(s, a, b, beta=beta, alpha=w) for s, a, b in pairs)
    new = mode_stats(x)
    if inplace:
        return tuple(s.mul_(beta).add_(n, alpha=w) if beta != 1 else s.add_(n) for s, n in zip(stats, new))
    return tuple(s + n if beta == 1 else beta * s + w * n for s, n in zip(stats, new))


def precondition(x: Tensor, roots: list[Tensor]) -> Tensor:
    """``x ×₁ Q₁ ×₂ Q₂ … ×_k Q_k`` blockwise (``Qᵢ`` symmetric, ``(B, bᵢ, bᵢ)``); for a
    matrix block ``Q₁ X Q₂``."""
    if x.dim() == 3 and len(roots) == 2:        # bmm: matmul's broadcasting views cost more here
        return torch.bmm(torch.bmm(roots[0], x), roots[1])
    for q in roots:
        shape = x.shape
        x = (q @ x.reshape(shape[0], shape[1], -1)).reshape(shape).movedim(1, -1)
    return x


def kron_diagonal(roots: list[Tensor]) -> Tensor:
    """The diagonal of ``Q₁ ⊗ … ⊗ Q_k`` per block, laid out as the block
    (``(B, b₁, …, b_k)``): the outer product of the roots' diagonals."""
    out = roots[0].diagonal(dim1=-2, dim2=-1)
    for q in roots[1:]:
        d = q.diagonal(dim1=-2, dim2=-1)
        out = out.unsqueeze(-1) * d.reshape(d.shape[0], *([1] * (out.dim() - 1)), d.shape[-1])
    return out
