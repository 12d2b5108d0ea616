"""Long-tailed digits: Meta-Weight-Net against plain and class-balanced cross-entropy.

The data are scikit-learn's 8x8 digits (1797 images, shipped with scikit-learn, nothing
downloaded), split per class from one fixed seed: the first ``TEST_PER_CLASS`` = 50 images
of every class are the balanced test set (500), the next ``META_PER_CLASS`` = 10 the
balanced clean meta set (100, as Meta-Weight-Net's 10 per class), and the training set keeps
the next n_c images of class c, on the exponential profile of Cui et al. (2019) and Cao et
al. (2019), rounded to the nearest integer::

    n_c = round(n_max · IF^(−c/(C−1))),   c = 0..C−1,  n_max = 100, C = 10,

so class 0 keeps 100 images and class 9 keeps 100 / IF (IF = 10: 409 images in all; IF = 100:
250, the rarest three classes with 3, 2 and 1). :func:`class_counts` is the profile,
:func:`indices` the images of each split. ``longtail_digits(with_meta=True)`` adds the meta
set's 100 images to the training set: the baseline that spends on training what
Meta-Weight-Net spends on its upper problem. The loaders shuffle from fixed seeds, so a run's
seed changes the initial weights only, never the data.

Three losses for the same classifier (``reweighting.MLP``), on batches ``(x, y, n_y)`` whose
third entry is the training-set size of each example's class:

- :func:`class_balanced_ce`, Cui, Jia, Lin, Song and Belongie, "Class-Balanced Loss Based on
  Effective Number of Samples", CVPR 2019: class c weighs α_c = (1 − β) / (1 − β^{n_c}), the
  inverse of its *effective number* E_c = (1 − β^{n_c}) / (1 − β); the loss is the weighted
  mean Σ_i α_{y_i} ℓ_i / Σ_i α_{y_i} (PyTorch's ``cross_entropy(weight=α)``, so any
  normalisation of α cancels). β = 0 gives α_c = 1, plain cross-entropy (the baseline
  without reweighting); β → 1 gives inverse class frequency. programs/longtail_baseline.mlo
  runs both; with n_c ≤ 100, β = 0.999 is close to inverse frequency (E_100 = 95.2).
- :func:`weighted_ce`, Shu, Xie, Yi, Zhao, Zhou, Xu and Meng, "Meta-Weight-Net: Learning
  an Explicit Mapping for Sample Weighting", NeurIPS 2019: each example weighs w(ℓ_i), a
  small network of its own (detached) loss, normalised by Σ_i w(ℓ_i) as in the paper's code;
  the weight net (``reweighting.WeightNet``) is the upper problem of programs/longtail.mlo,
  trained by hypergradients so that the classifier does well on the balanced meta set.
- :func:`ce`: plain cross-entropy, the meta set's loss.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from reweighting import MLP, WeightNet  # noqa: F401  (the .mlo files name them through this module)

CLASSES = 10
N_MAX = 100
TEST_PER_CLASS = 50
META_PER_CLASS = 10
SPLIT_SEED = 0


def class_counts(imbalance: float, n_max: int = N_MAX, classes: int = CLASSES) -> list[int]:
    """The long-tailed profile n_c = round(n_max · IF^(−c/(C−1))), at least 1 per class."""
    if not imbalance >= 1:
        raise ValueError(f"the imbalance factor is n_max / n_min >= 1, got {imbalance!r}")
    if not 1 <= n_max <= _smallest_class() - TEST_PER_CLASS - META_PER_CLASS:
        raise ValueError(f"n_max must be 1 to {_smallest_class() - TEST_PER_CLASS - META_PER_CLASS}, got {n_max!r}")
    return [max(1, round(n_max * imbalance ** (-c / (classes - 1)))) for c in range(classes)]


@functools.lru_cache(maxsize=1)          # read once per process; callers only index it
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:   # the program's error: say what to install
        raise ImportError("longtail needs scikit-learn for its digits (pip install scikit-learn)") from e
    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target, dtype=torch.long)


def _smallest_class() -> int:
    return int(torch.bincount(_digits()[1]).min())


@functools.lru_cache(maxsize=1)
def _per_class() -> list[torch.Tensor]:
    """Each class's image indices in one fixed random order (``SPLIT_SEED``)."""
    _, y = _digits()
    g = torch.Generator().manual_seed(SPLIT_SEED)
    return [idx[torch.randperm(len(idx), generator=g)] for idx in (torch.nonzero(y == c).flatten()
                                                                 for c in range(CLASSES))]


def indices(name: str, imbalance: float = 100.0, n_max: int = N_MAX, with_meta: bool = False) -> list[torch.Tensor]:
    """The images of split ``name``, one index tensor per class (into scikit-learn's order):
    ``test`` 50 per class, ``meta`` 10 per class, ``train`` :func:`class_counts` per class.
    They never share an image, except that ``with_meta`` adds the meta set's images to
    ``train`` (n_c + 10 per class: a baseline given the images Meta-Weight-Net's upper
    problem sees)."""
    first = {"test": 0, "meta": TEST_PER_CLASS, "train": TEST_PER_CLASS + META_PER_CLASS}
    if name not in first:
        raise ValueError(f"split must be train, meta or test, got {name!r}")
    if name == "train":
        counts = class_counts(imbalance, n_max)
        start = TEST_PER_CLASS if with_meta else first["train"]
        counts = [n + META_PER_CLASS * with_meta for n in counts]
    else:
        start, counts = first[name], [META_PER_CLASS if name == "meta" else TEST_PER_CLASS] * CLASSES
    return [idx[start:start + n] for idx, n in zip(_per_class(), counts)]


def split(name: str, imbalance: float = 100.0, n_max: int = N_MAX, with_meta: bool = False) -> tuple[torch.Tensor, ...]:
    """The images of :func:`indices` as tensors: (x, y) for ``test`` and ``meta``; (x, y, n_y)
    for ``train``, n_y the training-set count of each example's class."""
    x, y = _digits()
    take = indices(name, imbalance, n_max, with_meta)
    rows = torch.cat(take)
    if name != "train":
        return x[rows], y[rows]
    counts = torch.tensor([len(t) for t in take])
    return x[rows], y[rows], counts[y[rows]]


def _loader(tensors: tuple[torch.Tensor, ...], batch_size: int, seed: int) -> DataLoader:
    """Seeded shuffling, reshuffled every epoch; a batch never exceeds the set (no empty epoch)."""
    return DataLoader(TensorDataset(*tensors), batch_size=min(batch_size, len(tensors[0])), shuffle=True,
                      drop_last=True, generator=torch.Generator().manual_seed(seed))


def longtail_digits(imbalance: float = 100.0, batch_size: int = 100, n_max: int = N_MAX, with_meta: bool = False,
                    seed: int = 1):
    """Batches (x, y, n_y) of the long-tailed training set (with the meta set's images if
    ``with_meta``)."""
    return _loader(split("train", imbalance, n_max, with_meta), batch_size, seed)


def meta_digits(batch_size: int = 100, seed: int = 2):
    """Batches (x, y) of the balanced clean meta set."""
    return _loader(split("meta"), batch_size, seed)


def test_digits():
    """The balanced test set, (x, y): 50 images of each class."""
    return split("test")


def class_balanced_ce(classifier: nn.Module, batch, beta: float = 0.999) -> torch.Tensor:
    """Σ_i α_{y_i} ℓ_i / Σ_i α_{y_i} with α_c = (1 − β)/(1 − β^{n_c}) (Cui et al. 2019);
    β = 0: plain cross-entropy."""
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    x, y, n_y = batch
    losses = F.cross_entropy(classifier(x), y, reduction="none")
    alpha = (1 - beta) / (1 - beta ** n_y.to(losses.dtype))
    return (alpha * losses).sum() / alpha.sum()


def weighted_ce(classifier: nn.Module, weight_net: nn.Module, batch) -> torch.Tensor:
    """Meta-Weight-Net's loss: Σ_i w(ℓ_i) ℓ_i / Σ_i w(ℓ_i), w reading each (detached) loss."""
    x, y, _ = batch
    losses = F.cross_entropy(classifier(x), y, reduction="none")
    weights = weight_net(losses.detach())
    return (weights * losses).sum() / weights.sum().clamp_min(1e-8)


def ce(classifier: nn.Module, batch) -> torch.Tensor:
    x, y = batch[:2]
    return F.cross_entropy(classifier(x), y)


@torch.no_grad()
def accuracy(classifier: nn.Module, data, classes: tuple[int, ...] | None = None) -> float:
    """Accuracy on ``data`` = (x, y), over the examples of ``classes`` only if given (e.g.
    the tail: ``classes=(7, 8, 9)``)."""
    x, y = data[:2]
    x = x.to(next(classifier.parameters()))
    right = classifier(x).argmax(-1).cpu() == y
    if classes is not None:
        right = right[torch.isin(y, torch.tensor(classes))]
    return right.float().mean().item()
