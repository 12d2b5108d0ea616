"""Faults on purpose, for the reliability tests: the small program's pieces (``small.py``)
plus losses that raise, turn NaN or sleep, on one rank or all."""

import time
from pathlib import Path

import torch
import torch.distributed as dist

from small import Net, Weights, accuracy, ce, data, weighted  # noqa: F401

CALLS = {"n": 0}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def ce_raising(net, batch, rank: int = -1, after: int = 7):
    """The clean loss until the `after`-th call, then a ValueError (on `rank`; -1: every rank)."""
    CALLS["n"] += 1
    if CALLS["n"] > after and rank in (-1, _rank()):
        raise ValueError(f"labels out of range (rank {_rank()})")
    return ce(net, batch)


def ce_nan(net, batch, rank: int = -1, after: int = 7):
    """The clean loss until the `after`-th call, then NaN (on `rank`; -1: every rank)."""
    CALLS["n"] += 1
    loss = ce(net, batch)
    return loss * float("nan") if CALLS["n"] > after and rank in (-1, _rank()) else loss


def ce_slow(net, batch, seconds: float = 0.02):
    """The clean loss, after a pause (a window to interrupt a run in)."""
    time.sleep(seconds)
    return ce(net, batch)


def ce_stall(net, batch, flag: str = ""):
    """The clean loss; while the file FLAG exists, a call first waits for it to go (at most
    ten minutes): a step that is still running when a test interrupts the run. It leaves
    `stalled` beside FLAG on entering the wait and `unstalled` on leaving it."""
    if flag and Path(flag).exists():
        here = Path(flag).parent
        (here / "stalled").touch()
        deadline = time.monotonic() + 600
        while Path(flag).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (here / "unstalled").touch()
    return ce(net, batch)


def bad_eval(net):
    """An evaluation that raises, except on its first call (the compile-time trial of the
    evaluations, on the initial modules, in the same process as `mloc run`'s training)."""
    CALLS["evals"] = CALLS.get("evals", 0) + 1
    if CALLS["evals"] > 1:
        raise RuntimeError("evaluation failed on purpose")
    return 0.0
