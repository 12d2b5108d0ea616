"""``Session.save`` under torchrun (two gloo ranks; slow tier): every rank calls it, rank 0
alone writes the file, and a session restored from it continues bitwise as it did after
the save, with asynchronous Shampoo roots in flight at the save (their shares are exchanged
across the ranks before the state is taken)."""

from __future__ import annotations

import pytest

from tests.runtime_loop._gloo import run_workers


@pytest.mark.slow
def test_session_save_under_two_ranks_writes_once_and_restores_bitwise(tmp_path):
    ranks = run_workers("tests.shampoo._session_save_worker", 2, 300, SAVE_OUT=str(tmp_path), OMP_NUM_THREADS="1")
    assert [r["writes"] for r in ranks] == [1, 0]
    assert all(r["same"] and r["tensors"] > 10 for r in ranks), ranks
    assert (tmp_path / "session.pt").is_file()
