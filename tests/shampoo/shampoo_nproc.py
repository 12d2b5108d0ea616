"""A tiny two-level program's code for the ``mloc run --nproc`` Shampoo tests
(tests/shampoo/test_nproc_run.py): tests/run/small.py's nets, losses and synthetic data,
read in order (no evaluations: ``--dtype float64`` casts the modules and batches; an
evaluation reading its dataset directly would not be)."""

from tests.run.small import Net, Weights, ce, weighted  # noqa: F401  (the program's names)
from tests.run.small import data as _data


def data(seed: int = 0, n: int = 128, batch_size: int = 16):
    """In order (no shuffling): ``--nproc 2`` with ``batch_size=8`` reads, step by step, the
    same 16 examples as one process with ``batch_size=16`` (mloc/runtime/program/data.py)."""
    return _data(seed, n, batch_size, shuffle=False)
