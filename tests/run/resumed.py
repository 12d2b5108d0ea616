"""small.py's program, with a loss that fails while a marker file exists (the resume tests)."""

from pathlib import Path

from small import Net, Weights, accuracy, ce, data, weighted  # noqa: F401 - the program's names

CALLS = {"n": 0}


def ce_failing_while(net, batch, marker: str, after: int = 7):
    """The clean loss; while the file `marker` exists, a ValueError from the `after`+1-th
    call on (calls on the meta device, mloc's trace at compile time, are not counted)."""
    if batch[0].device.type != "meta":
        CALLS["n"] += 1
        if CALLS["n"] > after and Path(marker).exists():
            raise ValueError(f"failing while {marker} exists")
    return ce(net, batch)
