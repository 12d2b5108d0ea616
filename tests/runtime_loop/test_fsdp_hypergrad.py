"""``Program.hypergradients()`` under `strategy = fsdp` (slow tier: two gloo processes,
``_fsdp_hg_worker.py``), for each method whose registry caps say ``shards`` (a new such
method is covered here automatically): every rank calls it and gets the same whole tensors,
equal to one process's with the combined batch (``fsdp_hg.mlo``, data in order: two ranks
with batch 8 see one process's batch 16), at the initial state (where it draws the first
batches, as one process does: the steps after it then see the same data) and after 2 outer
steps, where it leaves the gathered training state, the batches and every ``.grad`` exactly
as they were.

Tolerances. float64: 1e-12 relative, as tests/runtime_loop/test_fsdp.py (the only
difference is the order of the sums: FSDP's reduce-scatter averages two batch means where
one process takes one; measured <= 4.0e-14). float32: test_fsdp_run.py's 1e-5 compares
parameters after training, which the hypergradient moves only by lr times itself; the
hypergradient of ``finite_diff``/``sama`` is a central difference whose float32 round-off
is divided by ``2ε`` (``ε‖q‖ = 0.01``), so one process's own float32 answer is 1.1e-5 to
1.7e-5 (norm-wise) from its float64 one, and no float32 computation can be held closer to
it than that. The bound is therefore that yardstick: the sharded float32 hypergradient is
within 4 times the distance between one process's float32 and float64 hypergradients (plus
1e-6 for ``first_order``, where that distance is float32's ulp), measured 0.64 to 1.09 times
it (printed by ``python -m pytest -m slow -s tests/runtime_loop/test_fsdp_hypergrad.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mloc
from mloc.builtins import METHODS
from tests.runtime_loop._gloo import run_workers

SHARDS = sorted(n for n, d in METHODS.items() if d.caps.shards)
PROGRAM = Path(__file__).resolve().parent / "fsdp_hg.mlo"
WHEN = ("initial", "after")


def _sharded(method: str, dtype: str) -> dict:
    """Rank 0's result after checking that both ranks returned the same whole tensors and
    left everything as it was."""
    ranks = run_workers("tests.runtime_loop._fsdp_hg_worker", 2, timeout=120, OMP_NUM_THREADS="1",
                        HG_METHOD=method, HG_BATCH="8", HG_DTYPE=dtype)
    for r in ranks:
        assert r["untouched"] == {"state": True, "batches": True, "grad": True}, r["untouched"]
    assert ranks[0]["initial"] == ranks[1]["initial"] and ranks[0]["after"] == ranks[1]["after"]
    return {w: {k: torch.tensor(v, dtype=getattr(torch, dtype)) for k, v in ranks[0][w]["weights"].items()}
            for w in WHEN}


def _one_process(method: str, dtype: str) -> dict:
    """The same calls in one process, batch 16 (the program's own)."""
    session = mloc.load(PROGRAM, set=[f"weights->net.hypergrad={method}"], dtype=dtype)
    try:
        first = session.hypergradients()["weights"]
        session.run(2)
        return {"initial": first, "after": session.hypergradients()["weights"]}
    finally:
        session.program.close()


def _relative(a: dict, b: dict) -> float:
    """``‖a − b‖ / ‖b‖`` over every slot together, in float64."""
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in b)
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    assert den > 0, "a zero hypergradient compares nothing"
    return (num / den) ** 0.5


@pytest.mark.slow
@pytest.mark.parametrize("method", SHARDS)
def test_sharded_hypergradients_equal_one_process_with_the_combined_batch(method):
    one32, one64 = _one_process(method, "float32"), _one_process(method, "float64")
    fsdp32, fsdp64 = _sharded(method, "float32"), _sharded(method, "float64")
    for w in WHEN:
        err64, rounding, err32 = _relative(fsdp64[w], one64[w]), _relative(one32[w], one64[w]), \
            _relative(fsdp32[w], one32[w])
        print(f"{method} {w}: float64 {err64:.2e}; float32 {err32:.2e} = {err32 / rounding:.2f} x its rounding "
              f"{rounding:.2e}")      # the numbers docs/runtime.md quotes (pytest -s)
        assert err64 <= 1e-12, (w, err64)
        assert err32 <= 4 * rounding + 1e-6, (w, err32, rounding)
