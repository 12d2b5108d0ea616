"""The split of a refresh's roots across data-parallel ranks by estimated cost
(mloc/runtime/optim/rootsplit.py): LPT's balance bound, every chunk once, the same
assignment from the same shapes, no worse than Graham's 4/3 of the best split (found by
exhaustive search on small refreshes), and RootBatch's per-rank shares, put together by
``owned_rows``, equal to one process's roots bit for bit (no collective needed: each
rank's ``local`` is run in turn in this process)."""

from __future__ import annotations

import itertools

import pytest
import torch

from mloc.runtime.optim.rootbatch import RootBatch, owned_rows, refresh_groups
from mloc.runtime.optim.rootsplit import ROOT_CHUNK, assign, chunk_cost, chunks, loads

# (n, size) groups: mixed sizes, partial last chunks, one-matrix groups, a group of many chunks
MIXED = [(2 * ROOT_CHUNK + 3, 32), (1, 128), (2, 96), (ROOT_CHUNK, 64), (5, 10), (3 * ROOT_CHUNK, 48), (1, 7)]


def _costs(groups):
    return [chunk_cost(chunks(n)[0], size) for n, size in groups for _ in range(chunks(n)[1])]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("groups", [MIXED, MIXED[::-1], [(ROOT_CHUNK * 9 + 2, 32), (2, 10)], [(3, 5)]])
def test_every_chunk_once_balanced_within_the_largest_chunk(groups, world):
    owners = assign(groups, world)
    assert [len(o) for o in owners] == [chunks(n)[1] for n, _ in groups]       # every chunk, once
    assert all(0 <= r < world for o in owners for r in o)
    load = loads(groups, owners, world)
    costs = _costs(groups)
    assert sum(load) == sum(costs)
    assert max(load) - min(load) <= max(costs)                                  # LPT's bound
    assert assign(list(groups), world) == owners                                # from the shapes alone


def test_the_split_is_by_cost_not_by_count():
    """bench/shampoo_dp.py --model taper's refresh, worked by hand: 128³ (2.10M) to rank 0,
    2·96³ (1.77M) to rank 1, 2·80³ (1.02M) to the lighter rank 1, 2·64³ (0.52M) and 10³ to
    rank 0. Round robin by count (chunks 0, 2, 4 to rank 0) gave rank 0 128³ + 2·80³ + 10³,
    3.12M, against this split's 2.79M, the best possible here (no split of the four
    big chunks does better)."""
    groups = [(1, 128), (2, 96), (2, 80), (2, 64), (1, 10)]
    owners = assign(groups, 2)
    assert owners == ((0,), (1,), (1,), (0,), (0,))
    assert loads(groups, owners, 2) == [128 ** 3 + 2 * 64 ** 3 + 10 ** 3, 2 * (96 ** 3 + 80 ** 3)]
    assert max(loads(groups, owners, 2)) < 128 ** 3 + 2 * 80 ** 3 + 10 ** 3


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_within_grahams_bound_of_the_best_split(world, seed):
    """Exhaustive search over every assignment of ≤ 7 chunks: LPT's most-loaded rank is
    within (4/3 − 1/(3·world)) of the best split's (Graham 1969)."""
    gen = torch.Generator().manual_seed(seed)
    groups = [(int(n), int(s)) for n, s in zip(torch.randint(1, 2 * ROOT_CHUNK, (3,), generator=gen),
                                               torch.randint(4, 80, (3,), generator=gen))]
    costs = _costs(groups)
    if len(costs) > 7:
        groups, costs = groups[:2], _costs(groups[:2])
    best = min(max(sum(c for c, r in zip(costs, split) if r == k) for k in range(world))
               for split in itertools.product(range(world), repeat=len(costs)))
    lpt = max(loads(groups, assign(groups, world), world))
    assert best <= lpt and 3 * world * lpt <= (4 * world - 1) * best


def test_bad_world_is_an_error():
    with pytest.raises(ValueError, match="world"):
        assign([(3, 4)], 0)


def _stats(seed: int):
    """Statistics of mixed sizes and orders (the refresh's groups: sizes 12, 6, 3 with p 4
    and size 6 with p 2), some groups over several chunks, one all-zero (status -1)."""
    gen = torch.Generator().manual_seed(seed)

    def spd(b, n):
        x = torch.randn(b, n, 2 * n, generator=gen, dtype=torch.float64)
        return (x @ x.transpose(-2, -1)).float()
    stats = ((spd(ROOT_CHUNK + 5, 12), spd(3, 6)), (spd(2 * ROOT_CHUNK, 12), spd(1, 3)), (spd(4, 6),))
    stats[1][1].zero_()
    return stats, (4, 4, 2)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_shares_put_together_equal_one_process_bitwise(world):
    stats, ps = _stats(0)
    whole = RootBatch(1e-6, "newton").compute(stats, ps)
    groups = refresh_groups(stats, ps)
    owners = assign(groups, world)
    got = {key: [[torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 7)
                  for t in ts] for ts in whole[key]] for key in ("roots", "status")}
    computed = 0
    for rank in range(world):
        batch = RootBatch(1e-6, "newton", shard=(rank, world))
        share = batch.local(stats, ps)
        computed += batch.computed
        # the rows owned_rows names (what exchange sends), group by group in the refresh's order
        order = {}
        for i, ss in enumerate(stats):
            for j, s in enumerate(ss):
                order.setdefault((s.shape[-1], ps[i]), []).append((i, j))
        for items, (n, _), own in zip(order.values(), groups, owners):
            rows = set(owned_rows(n, own, rank).tolist())
            at = 0
            for i, j in items:
                for x in range(stats[i][j].shape[0]):
                    if at + x in rows:
                        for key in ("roots", "status"):
                            got[key][i][j][x] = share[key][i][j][x]
                at += stats[i][j].shape[0]
    assert computed == sum(n for n, _ in groups)                  # every root by one rank
    for key in ("roots", "status"):
        for a, b in zip(itertools.chain(*whole[key]), itertools.chain(*got[key])):
            assert a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                      b.contiguous().view(torch.uint8)), key
    assert whole["status"][1][1].tolist() == [-1]
