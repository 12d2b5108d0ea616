"""Evaluations that return NaN, for the exit-code tests: the small program's pieces
(``small.py``) plus a metric that is NaN on every other call and one that is always NaN."""

from small import Net, Weights, ce, data, weighted  # noqa: F401

CALLS = {"n": 0}


def flaky(net):
    """NaN on every other call; otherwise the call count (so later values are larger)."""
    CALLS["n"] += 1
    return float("nan") if CALLS["n"] % 2 == 0 else float(CALLS["n"])


def broken(net):
    """Always NaN (a metric of a diverged model)."""
    return float("nan")
