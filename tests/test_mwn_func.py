"""The benchmark's hand-compiled loop (bench/mwn_func.py) trains the reference's program.

bench/run_vs_betty.py times Meta-Weight-Net written with `torch.func` and compiled with
`torch.compile(fullgraph=True)` beside the `autograd.grad` loop of tests/reference/mwn_hand.py;
both must be the same training run. In float64, from the same seed, after 5 outer steps
with 2 lower steps each, every parameter of both problems agrees to 1e-12 relative
(measured: 2e-16 to 2.5e-15, eager and compiled), for every method both implement. The
compiled case compiles two graphs per method (10–30 s each on one thread): slow tier.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "reference"))

import mwn_func  # noqa: E402
import mwn_hand  # noqa: E402

KWARGS = {"finite_diff": dict(eps=0.01), "sama": dict(eps=0.01),
          "neumann": dict(iters=3, alpha=0.1), "cg": dict(iters=3)}
STEPS, UNROLL = 5, 2


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _worst(a: dict, b: dict) -> tuple[float, str]:
    errors = {f"{p}.{n}": float((a[p][n] - t).norm() / t.norm()) for p, ps in b.items() for n, t in ps.items()}
    worst = max(errors, key=errors.get)
    return errors[worst], worst


def _check(method: str, compile: bool) -> None:
    ours = mwn_func.FuncMWN(method, compile=compile, dtype=torch.float64, unroll=UNROLL, **KWARGS[method])
    ref = mwn_hand.MWNLoop(method, dtype=torch.float64, unroll=UNROLL, **KWARGS[method])
    start = ref.parameters()
    for _ in range(STEPS):
        ours.outer_step()
        ref.outer_step()
    error, where = _worst(ours.parameters(), ref.parameters())
    assert error <= 1e-12, f"{method} ({'compiled' if compile else 'eager'}): {where} differs by {error:.2e}"
    moved, _ = _worst(ref.parameters(), start)
    assert moved > 1e-6, f"{method}: the parameters did not move"


@pytest.mark.parametrize("method", mwn_func.METHODS)
def test_func_loop_matches_hand_loop_eagerly(method, one_thread):
    _check(method, compile=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", mwn_func.METHODS)
def test_compiled_func_loop_matches_hand_loop(method, one_thread):
    torch._dynamo.reset()
    _check(method, compile=True)
    torch._dynamo.reset()
