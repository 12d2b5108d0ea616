"""Asynchronous roots split across data-parallel ranks (issue 26), two gloo ranks
(tests/shampoo/_async_sharded_worker.py; slow tier: two interpreters and their root
workers, about a minute on 2 busy cores).

Under ``ddp`` each rank's worker computes only its share of a refresh's roots and the
shares are exchanged when the roots are due (mloc/runtime/optim/rootwork.py); under
``zero`` each rank computes all the roots of the statistics it owns. Every rank draws the
same gradients (what the all-reduce gives), so every comparison here is bitwise: the
asynchronous runs (worker process, background thread) against the synchronous split run
with the same staleness, rank 0 against rank 1, and the split runs against one process.
From step ``NAN_AT`` one block's statistics are NaN, so its roots are rejected at every
refresh after it (the previous root kept, a failure counted): the status travels with its
root from the rank that computed it, so the failure counts are bitwise the same too. Each
run drains mid-refresh (a slot pending) at ``DRAIN_AT``, as a checkpoint does.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime_loop._gloo import run_workers
from tests.shampoo.test_nproc_run import leaves
from tests.shampoo._async_sharded_worker import initial, train


def bitwise(a, b) -> bool:
    """Every tensor of ``a`` equals ``b``'s bit for bit (NaNs included)."""
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) > 0 and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8),
                                                                  y.contiguous().view(torch.uint8))
        for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("aroots")
    report = run_workers("tests.shampoo._async_sharded_worker", 2, 300, AROOTS_OUT=str(out), OMP_NUM_THREADS="1")
    return report, [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.slow
def test_each_rank_computes_its_share_in_its_worker(ranks):
    report, _ = ranks
    plain = train("thread", initial())[0].work.batch.computed       # one process: every root
    for r, rep in enumerate(report):
        assert rep["sync"]["shard"] == rep["process"]["shard"] == rep["process"]["worker_shard"] == [r, 2]
        assert rep["process"]["answered"] > 0 and rep["process"]["computed"] == 0    # all in the worker
        assert 0 < rep["thread"]["computed"] == rep["sync"]["computed"] < plain
    assert report[0]["sync"]["computed"] + report[1]["sync"]["computed"] == plain


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_async_split_roots_equal_the_synchronous_split_run_bitwise(ranks, mode):
    _, saved = ranks
    for rank in saved:
        assert bitwise(rank[mode], rank["sync"]), mode
        assert any(f.max() > 0 for f in leaves(rank[mode]["state"]["failures"]))   # rejected roots
    assert bitwise(saved[0][mode], saved[1][mode])


@pytest.mark.slow
def test_the_split_runs_equal_one_process_bitwise(ranks):
    _, saved = ranks
    params = initial()
    _, state = train("sync", params)
    assert bitwise(saved[0]["sync"], {"params": params, "state": state._asdict()})


@pytest.mark.slow
def test_zero_async_roots_equal_zeros_synchronous_run_bitwise(ranks):
    report, saved = ranks
    for r, rep in enumerate(report):
        assert rep["zero-process"]["shard"] is None and rep["zero-process"]["worker_shard"] is None
        assert rep["zero-process"]["answered"] > 0
        assert rep["zero-sync"]["computed"] > 0
        assert bitwise(saved[r]["zero-process"], saved[r]["zero-sync"])
    assert bitwise(saved[0]["zero-process"], saved[1]["zero-process"])          # gathered: whole
    assert sum(rep["zero-sync"]["computed"] for rep in report) == \
        train("thread", initial())[0].work.batch.computed

