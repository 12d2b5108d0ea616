"""Evaluations that report the dtypes their data arrives in (tests/run/test_dtype.py):
each returns, per kind of data argument, 1.0 when the floating inputs are float64 and the
labels int64, 0.0 otherwise, after running the net on them (a float64 net refuses float32)."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def _points(n: int = 32, seed: int = 30):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)                      # float32, as user code makes it
    return x, (x[:, 0] > 0).long()


def points(n: int = 32):
    """A tuple (x float32, y int64)."""
    return _points(n)


def loader(n: int = 32, batch_size: int = 8):
    """A DataLoader of (x float32, y int64) batches."""
    return DataLoader(TensorDataset(*_points(n)), batch_size=batch_size)


def stream(n: int = 32, batch_size: int = 8):
    """A generator of (x float32, y int64) batches."""
    x, y = _points(n)
    for i in range(0, n, batch_size):
        yield x[i:i + batch_size], y[i:i + batch_size]


def _seen(net, batches) -> float:
    ok = 1.0
    for x, y in batches:
        net(x)
        ok = min(ok, float(x.dtype == torch.float64 and y.dtype == torch.int64))
    return ok


def seen(net, pair, loaded, streamed, weights: list) -> dict:
    """What each data argument arrived as; `weights` is a literal list (not data: as written)."""
    return {"tuple": _seen(net, [pair]), "loader": _seen(net, loaded), "loader_len": float(len(loaded)),
            "stream": _seen(net, streamed), "literal": float(weights == [0.5, 1.5])}


def own_data(net) -> float:
    """Accuracy on data the function makes itself: out of `--dtype`'s reach."""
    x, y = _points()
    return (net(x).argmax(-1) == y).float().mean()
