"""Which rank computes which chunk of a refresh's inverse roots under data parallelism, and
the cost model that decides it.

A refresh's roots are computed in chunks (:meth:`.rootbatch.RootBatch._batched_root`): the
statistics of one (size, p) group, ``n`` matrices of ``size × size``, in ``count`` batches of
``chunk = min(ROOT_CHUNK, n)`` matrices, the last padded with identities. A chunk is computed
whole by one rank, whatever the layout, so that every root is one process's bit for bit.

Cost model (:func:`chunk_cost`): ``chunk × size³``. Both ways of computing a root are cubic
in the size: a coupled-Newton iteration (Guo & Higham 2006, :mod:`.roots`) is a few
``size × size`` matrix products per matrix (``x·t``, ``tᵖ`` by squarings, ``tᵖ·m``: each
``2·size³`` flops), and the eigh fallback is ``O(size³)`` too (Golub & Van Loan, §8.3). The
padded identities are computed like the real matrices (the batch iterates as one), so the
chunk's width counts, not its real rows. Left out, because they are unknown before the
roots are computed or equal across chunks to within a small factor: the number of Newton
iterations (data-dependent; a batch runs until its slowest matrix converges, ~10–20) and
the order ``p`` (``⌊log₂ p⌋ + popcount(p) − 1`` products for ``tᵖ``: one more for ``p = 4``
than for ``p = 2``). Also left out: a fixed cost per chunk (Newton's ~20 iterations each read
``active.any()`` on the host: ~1 ms for a chunk of one 10×10 matrix on one CPU thread,
against ~8 ms for one 128×128, ``bench/root_chunk_time.py``), which only matters where
the chunks are tiny and their cost is small anyway.
"""

from __future__ import annotations

import heapq
from typing import Sequence

ROOT_CHUNK = 16
"""Roots are computed in batches of at most this many matrices (``RootBatch._batched_root``)."""


def chunks(n: int) -> tuple[int, int]:
    """``(chunk, count)``: a group of ``n`` matrices is computed in ``count`` chunks of
    ``chunk`` matrices."""
    chunk = min(ROOT_CHUNK, n)
    return chunk, -(-n // chunk)


def chunk_cost(chunk: int, size: int) -> int:
    """The estimated cost of one chunk of ``chunk`` matrices of ``size × size``: ``chunk ·
    size³`` (the module docstring says why), an exact integer so that every process
    ranks the chunks the same."""
    return chunk * size ** 3


def assign(groups: Sequence[tuple[int, int]], world: int) -> tuple[tuple[int, ...], ...]:
    """The rank that computes each chunk of a refresh: ``owners[g][c]`` for chunk ``c`` of
    group ``g``, the groups given as ``(n, size)`` (``n`` matrices of ``size × size``) in the
    refresh's order. From the shapes alone, in integers, so every rank and every background
    worker computes the same assignment without a collective.

    Longest processing time first (Graham, "Bounds on multiprocessing timing anomalies",
    SIAM J. Appl. Math. 17, 1969): the chunks by decreasing :func:`chunk_cost` (ties: the
    earlier group, then the earlier chunk), each to the rank with the least cost so far
    (ties: the lowest rank). The rank that ends with the most cost took its last chunk
    when it had the least, so the most and the least loads differ by at most the largest
    chunk's cost; the most is within 4/3 of the best split's (Graham's bound)."""
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    work = []                           # (-cost, group, chunk): the order LPT takes them in
    for g, (n, size) in enumerate(groups):
        chunk, count = chunks(n)
        work += [(-chunk_cost(chunk, size), g, c) for c in range(count)]
    owners = [[0] * chunks(n)[1] for n, _ in groups]
    loads = [(0, rank) for rank in range(world)]          # a heap of (cost so far, rank)
    for cost, g, c in sorted(work):
        load, rank = heapq.heappop(loads)
        owners[g][c] = rank
        heapq.heappush(loads, (load - cost, rank))
    return tuple(map(tuple, owners))


def loads(groups: Sequence[tuple[int, int]], owners, world: int) -> list[int]:
    """The estimated cost each rank computes under ``owners`` (:func:`assign`'s form)."""
    out = [0] * world
    for (n, size), own in zip(groups, owners):
        for rank in own:
            out[rank] += chunk_cost(chunks(n)[0], size)
    return out
