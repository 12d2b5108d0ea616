"""Learning by ignoring (Zhao, He and Xie, "Learning by Ignoring, with Application to Domain
Adaptation", arXiv:2012.14288, 2021) on scikit-learn's 8x8 digits (shipped with
scikit-learn, never downloaded).

A model is pre-trained on a *source* set, part of which does not fit the target task, then
fine-tuned on a small *target* set; an ignoring variable per source example decides how much
that example counts in pre-training, and is learned on a target *validation* set through both
training stages. With a ∈ Rⁿ the ignoring logits of the n source examples and σ(aᵢ) ∈ (0, 1)
their weights, ℓᵢ(W) the cross-entropy of source example i under the pre-trained model W:

    finetune (bottom):  V*(W)  = argmin_V  CE(V; target train) + (λ/2)‖V − W‖²
    pretrain (middle):  W*(a)  = argmin_W  Σᵢ σ(aᵢ) ℓᵢ(W) / Σᵢ σ(aᵢ) + (μ/2)‖W − V*(W)‖²
    ignore   (top):     min_a  CE(V*(W*(a)); target validation)

The coupling of the two stages is LBI's own: the fine-tuned model's loss reads the
pre-trained weights through the proximal term (λ/2)‖V − W‖² (programs/lbi.mlo; the
alternative, starting each fine-tuning from W with `init = pretrain`, would restart the
fine-tuning at every outer step). The paper's program is μ = 0: pre-training never sees the
fine-tuned model. mloc requires every upper problem's loss to read a problem below it (E211),
so the pre-training loss always names `finetune`; μ > 0 (the default) is a two-way proximal
coupling that pulls the pre-trained model towards the fine-tuned one. It is also what makes
the middle level read the level below it (feedback), the case where the `exact` and
`per_edge` semantics differ: with μ = 0 (`--set pretrain.loss.mu=0`) the two coincide.

Data (fixed by seed 0 whatever the run's seed, which draws the initial weights): the 1797
images, pixels scaled to [0, 1], shuffled once and cut into ``source`` (1000), ``train`` (50:
the target's training set), ``val`` (200) and ``test`` (547). The corruption is label noise on
a known subset: ``noise`` of the source examples (chosen by seed 1) get a uniformly drawn
*wrong* label (:func:`corrupted`); the target splits are clean. ``pool`` > 1 averages
``pool``×``pool`` pixel blocks (a tiny instance for exact tests: ``pool=4`` leaves 4 inputs).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"source": 1000, "train": 50, "val": 200}      # "test": the remaining 547
NOISE = 0.5


class Net(nn.Module):
    """``features`` → ``hidden`` (ReLU) → ``classes``; ``hidden=0`` is a linear classifier."""

    def __init__(self, features: int = 64, hidden: int = 32, classes: int = 10):
        super().__init__()
        layers = [nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes)] if hidden else \
            [nn.Linear(features, classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Ignore(nn.Module):
    """The ignoring logits a ∈ Rⁿ, one per source example, from 0 (every weight σ(0) = ½)."""

    def __init__(self, size: int = SIZES["source"]):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(size))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits[index])


# --- data ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)          # read once per process; callers only slice it
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("lbi needs scikit-learn for its digits (pip install scikit-learn)") from e
    d = load_digits()
    order = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(0))
    return torch.tensor(d.data, dtype=torch.float32)[order] / 16.0, torch.tensor(d.target, dtype=torch.long)[order]


def split(name: str, size: int | None = None, pool: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``size`` images of split ``name`` (all by default) and their true labels."""
    x, y = _digits()
    lo = 0
    for part in ("source", "train", "val", "test"):
        hi = lo + SIZES[part] if part in SIZES else len(y)
        if part == name:
            break
        lo = hi
    else:
        raise ValueError(f"split must be one of source, train, val, test; got {name!r}")
    if size is not None and not 0 < size <= hi - lo:
        raise ValueError(f"split {name!r} has {hi - lo} images; size must be 1 to {hi - lo}, got {size}")
    hi = hi if size is None else lo + size
    x = x[lo:hi]
    if pool > 1:
        x = F.avg_pool2d(x.view(-1, 1, 8, 8), pool).flatten(1)
    return x, y[lo:hi]


def corrupted(size: int = SIZES["source"], noise: float = NOISE) -> torch.Tensor:
    """The known corrupted subset of the first ``size`` source examples (a boolean mask):
    ⌊noise · 1000⌋ of the 1000 source examples, drawn by seed 1, the same for every size."""
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(SIZES["source"], dtype=torch.bool)
    mask[torch.randperm(SIZES["source"], generator=g)[:int(noise * SIZES["source"])]] = True
    return mask[:size]


def source_labels(size: int = SIZES["source"], noise: float = NOISE) -> torch.Tensor:
    """The source labels as training sees them: each corrupted example's replaced by a
    uniformly drawn wrong class (true + 1..9 mod 10, seed 2)."""
    _, y = split("source", size)
    shift = torch.randint(1, 10, (SIZES["source"],), generator=torch.Generator().manual_seed(2))[:size]
    return torch.where(corrupted(size, noise), (y + shift) % 10, y)


def source(batch_size: int = SIZES["source"], size: int = SIZES["source"], noise: float = NOISE,
           pool: int = 1, seed: int = 3) -> DataLoader:
    """Batches (x, noisy label, index into the source) of the source set."""
    x, _ = split("source", size, pool)
    data = TensorDataset(x, source_labels(size, noise), torch.arange(size))
    return DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=batch_size < size,
                      generator=torch.Generator().manual_seed(seed))


def target(name: str = "train", batch_size: int | None = None, size: int | None = None, pool: int = 1,
           seed: int = 4) -> DataLoader:
    """Batches (x, y) of a target split (the whole split per batch by default)."""
    x, y = split(name, size, pool)
    batch_size = batch_size or len(y)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=batch_size < len(y),
                      generator=torch.Generator().manual_seed(seed))


# --- losses --------------------------------------------------------------------------------------
def _distance2(a: nn.Module, b: nn.Module) -> torch.Tensor:
    return sum((p - q).pow(2).sum() for p, q in zip(a.parameters(), b.parameters()))


def ignoring_ce(pretrain: nn.Module, ignore: Ignore, finetune: nn.Module, batch, mu: float = 0.01) -> torch.Tensor:
    """Σᵢ σ(aᵢ) ℓᵢ(W) / Σᵢ σ(aᵢ) over the batch, + (μ/2)‖W − V‖² (μ = 0: the paper's
    pre-training; the term is still formed, so the loss reads `finetune` either way)."""
    x, y, index = batch
    losses = F.cross_entropy(pretrain(x), y, reduction="none")
    weights = ignore(index)
    return (weights * losses).sum() / weights.sum() + 0.5 * mu * _distance2(pretrain, finetune)


def proximal_ce(finetune: nn.Module, pretrain: nn.Module, batch, lam: float = 0.05) -> torch.Tensor:
    """CE(V; batch) + (λ/2)‖V − W‖²: fine-tuning regularised towards the pre-trained model."""
    x, y = batch
    return F.cross_entropy(finetune(x), y) + 0.5 * lam * _distance2(finetune, pretrain)


def ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


# --- evaluation ------------------------------------------------------------------------------------
@torch.no_grad()
def accuracy(model: nn.Module, name: str = "test") -> float:
    """The accuracy of ``model`` (a :class:`Net`) on a split, pooled to the model's inputs."""
    pool = round(8 / model.net[0].in_features ** 0.5)
    x, y = split(name, pool=pool)
    return (model(x).argmax(-1) == y).float().mean().item()


@torch.no_grad()
def mean_weight(ignore: Ignore, subset: str = "corrupted", noise: float = NOISE) -> float:
    """The mean weight σ(aᵢ) over the ``corrupted`` or the ``clean`` source examples: the check
    that the ignoring variables ignore what they should (both ½ before training)."""
    if subset not in ("corrupted", "clean"):
        raise ValueError(f"subset must be 'corrupted' or 'clean', got {subset!r}")
    mask = corrupted(len(ignore.logits), noise)
    mask = mask if subset == "corrupted" else ~mask
    return torch.sigmoid(ignore.logits[mask]).mean().item() if mask.any() else float("nan")
