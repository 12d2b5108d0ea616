"""DARTS (Liu, Simonyan and Yang, "DARTS: Differentiable Architecture Search", ICLR 2019)
on scikit-learn's 8x8 digits.

The search space is a small convolutional cell. A cell has an input node and ``NODES``
intermediate nodes; node j sums one *mixed operation* from every node before it (the input
and nodes 1..j-1), so a cell has ``EDGES`` = 1 + 2 + 3 = 6 edges, and its output is the sum
of its intermediate nodes. A mixed operation on edge e is ``Σ_o softmax(α_e)_o · o(x)`` over
the candidates ``OPS`` (zero, skip, 3x3 and 1x1 ReLU-conv-BN, 3x3 average and max
pooling). The network is a 3x3 conv-BN stem, ``cells`` copies of the cell (one in
programs/darts.mlo; copies share α, as DARTS' normal cells do), global average pooling and
a linear head. The global pooling makes the choice matter: the stem is linear and skips
and average pools keep a channel's spatial mean, so through a cell of those alone the head
sees little more than each image's total ink (such networks stay near chance); it takes
the ReLU-convolutions (or max pools) to see the digit's shape.

Two problems (programs/darts.mlo): the network's weights w (lower) train on the training
split, α (upper) on the validation split, through ``finite_diff`` (DARTS' second-order
approximation, the mixed product ∇²_{α,w} L_train · ∇_w L_val by central differences) or
``first_order`` (its first-order variant: α follows ∇_α L_val alone). DARTS scales the
mixed term by ξ, the weights' learning rate; ``finite_diff`` takes ξ = 1 (the implicit
function theorem with an identity Hessian, as Betty's ``darts`` does), and ``sama`` over
SGD is ξ = lr exactly (tests/test_darts.py checks both in float64).

After the search, :func:`derive` reads α from a run folder and keeps, on every edge, the
strongest candidate other than ``zero`` (DARTS' rule, without its top-2 edge pruning: here
every edge stays). :func:`retrain` trains that fixed architecture from scratch and returns
its test accuracy; :func:`random_arch` draws an architecture from the same space, the
baseline (``python3 bench/darts_compare.py`` runs the whole comparison; docs/programs.md).

Data: the 1797 digits shipped with scikit-learn (no download), split as
``programs/deep_supervision.py`` does: 1397 for training, 400 for test; the search divides
the 1397 into 700 for the weights and 697 for α, the retraining uses all 1397.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from synthetic import loader

OPS = ("zero", "skip", "conv3x3", "conv1x1", "avgpool", "maxpool")
NODES = 3
EDGES = NODES * (NODES + 1) // 2
SEARCH_SPLIT = 700          # of the 1397 training images: weights; the rest: α


# --- the candidate operations ------------------------------------------------------------------
class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0


def _conv(channels: int, kernel: int, affine: bool) -> nn.Module:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels, kernel, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(channels, affine=affine))


def make_op(name: str, channels: int, affine: bool = False) -> nn.Module:
    """One candidate; BatchNorm without affine parameters during the search, as in DARTS."""
    if name == "zero":
        return Zero()
    if name == "skip":
        return nn.Identity()
    if name in ("conv3x3", "conv1x1"):
        return _conv(channels, 3 if name == "conv3x3" else 1, affine)
    if name == "avgpool":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    if name == "maxpool":
        return nn.MaxPool2d(3, stride=1, padding=1)
    raise ValueError(f"unknown operation {name!r}; the candidates are {', '.join(OPS)}")


def edge_inputs() -> list[tuple[int, int]]:
    """(source node, target node) of every edge, in α's row order; node 0 is the cell's input."""
    return [(i, j) for j in range(1, NODES + 1) for i in range(j)]


# --- the search network and α --------------------------------------------------------------------
class MixedOp(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.ops = nn.ModuleList(make_op(name, channels) for name in OPS)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return sum(w * op(x) for w, op in zip(weights, self.ops))


class Cell(nn.Module):
    """Input node 0, intermediate nodes 1..NODES; node j = Σ_{i<j} edge_(i,j)(node i)."""

    def __init__(self, edges: list[nn.Module]):
        super().__init__()
        self.edges = nn.ModuleList(edges)

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        nodes, k = [x], 0
        for j in range(1, NODES + 1):
            total = 0
            for i in range(j):
                edge = self.edges[k]
                total = total + (edge(nodes[i]) if weights is None else edge(nodes[i], weights[k]))
                k += 1
            nodes.append(total)
        return sum(nodes[1:])


class Network(nn.Module):
    """Stem (3x3 conv + BN), ``cells`` cells, global average pooling, linear head. Without
    ``arch`` every edge is a :class:`MixedOp` and ``forward`` takes α's softmax; with
    ``arch`` (one operation name per edge) each edge is that operation alone, with affine
    BatchNorm: the derived network that :func:`retrain` trains."""

    def __init__(self, channels: int = 16, cells: int = 1, classes: int = 10, arch: tuple[str, ...] | None = None):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        if arch is None:
            self.cells = nn.ModuleList(Cell([MixedOp(channels) for _ in range(EDGES)]) for _ in range(cells))
        else:
            arch = check_arch(arch)
            self.cells = nn.ModuleList(Cell([make_op(op, channels, affine=True) for op in arch])
                                       for _ in range(cells))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        h = self.stem(x.view(-1, 1, 8, 8))
        for cell in self.cells:
            h = cell(h, weights)
        return self.head(h.mean((2, 3)))


class Architecture(nn.Module):
    """α, one row of logits per edge over ``OPS``; ``forward`` gives its softmax per edge.
    Initialised at 1e-3 · N(0, 1), as in DARTS."""

    def __init__(self, edges: int = EDGES, ops: int = len(OPS)):
        super().__init__()
        self.alpha = nn.Parameter(1e-3 * torch.randn(edges, ops))

    def forward(self) -> torch.Tensor:
        return F.softmax(self.alpha, dim=-1)


# --- data, losses, evaluation ---------------------------------------------------------------------
@functools.lru_cache(maxsize=1)          # read once per process; callers only slice it
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:   # the program's error: say what to install
        raise ImportError("darts needs scikit-learn for its digits (pip install scikit-learn)") from e
    d = load_digits()
    order = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(0))
    return torch.tensor(d.data, dtype=torch.float32)[order] / 16.0, torch.tensor(d.target, dtype=torch.long)[order]


def split(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``search_train`` (700), ``search_val`` (697), ``train`` (their union, 1397), ``test`` (400)."""
    x, y = _digits()
    cut = {"search_train": (0, SEARCH_SPLIT), "search_val": (SEARCH_SPLIT, 1397), "train": (0, 1397),
           "test": (1397, len(y))}
    if name not in cut:
        raise ValueError(f"split must be one of {', '.join(cut)}, got {name!r}")
    lo, hi = cut[name]
    return x[lo:hi], y[lo:hi]


def digits(split_name: str = "search_train", batch_size: int = 64, seed: int = 0):
    """Batches of a split, reshuffled (seeded) every epoch."""
    x, y = split(split_name)
    return loader(x, y, batch_size, seed=seed)


def ce(net: Network, arch: Architecture, batch) -> torch.Tensor:
    """Cross-entropy of the mixed network under softmax(α): both levels' loss, on their own data."""
    x, y = batch
    return F.cross_entropy(net(x, arch()), y)


@torch.no_grad()
def accuracy(net: Network, arch: Architecture | None, data) -> float:
    """Accuracy on ``data`` (a split's name, or ``(x, y)``); ``arch=None`` for a fixed network."""
    x, y = split(data) if isinstance(data, str) else data
    x = x.to(next(net.parameters()))
    logits = net(x) if arch is None else net(x, arch())
    return (logits.argmax(-1) == y.to(logits.device)).float().mean().item()


# --- derive, draw, retrain ------------------------------------------------------------------------
def check_arch(arch) -> tuple[str, ...]:
    arch = tuple(arch)
    if len(arch) != EDGES or any(op not in OPS[1:] for op in arch):
        raise ValueError(f"an architecture is {EDGES} operations from {OPS[1:]}, got {arch}")
    return arch


def arch_from_alpha(alpha: torch.Tensor) -> tuple[str, ...]:
    """The strongest candidate other than ``zero`` on every edge (DARTS' derivation rule)."""
    keep = alpha[:, 1:]
    return tuple(OPS[1 + int(i)] for i in keep.argmax(-1))


def describe(arch: tuple[str, ...], alpha: torch.Tensor | None = None) -> str:
    lines = []
    for k, (i, j) in enumerate(edge_inputs()):
        line = f"  node {i} -> node {j}: {arch[k]}"
        if alpha is not None:
            probs = F.softmax(alpha[k], -1)
            line += "   (" + ", ".join(f"{o} {p:.2f}" for o, p in zip(OPS, probs.tolist())) + ")"
        lines.append(line)
    return "\n".join(lines)


def derive(run_dir: str | Path, checkpoint: str = "best.pt", quiet: bool = False) -> tuple[str, ...]:
    """The architecture a search run found: its program rebuilt with ``mloc.load`` (the
    run's ``--set``s and seed, from ``config.json``), its state restored from
    ``checkpoint`` (``checkpoint.pt`` when the run has no ``best.pt``), then
    :func:`arch_from_alpha` of α. Printed edge by edge unless ``quiet``."""
    import mloc

    run = Path(run_dir)
    config = json.loads((run / "config.json").read_text())["run"]
    session = mloc.load(config["program"]["file"], set=config["program"]["set"], seed=config["seed"])
    path = run / checkpoint if (run / checkpoint).exists() else run / "checkpoint.pt"
    session.restore(path)
    alpha = session.module("arch").alpha.detach().float()
    arch = arch_from_alpha(alpha)
    if not quiet:
        print(f"{run} ({path.name}, step {session.steps_done}):\n{describe(arch, alpha)}")
    return arch


def random_arch(seed: int) -> tuple[str, ...]:
    """An architecture drawn uniformly from the derived space (no ``zero``), from ``seed`` alone."""
    rng = random.Random(seed)
    return tuple(rng.choice(OPS[1:]) for _ in range(EDGES))


def retrain(arch, seed: int, steps: int = 400, channels: int = 16, cells: int = 1, batch_size: int = 64,
            lr: float = 0.05) -> float:
    """Train the fixed ``arch`` from scratch on all 1397 training images (SGD with momentum
    0.9, weight decay 3e-4, cosine rate) for ``steps`` steps; its test accuracy (400 images)."""
    torch.manual_seed(seed)
    net = Network(channels=channels, cells=cells, arch=check_arch(arch))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / steps)))
    data, done = digits("train", batch_size, seed=seed), 0
    net.train()
    while done < steps:
        for x, y in data:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if done == steps:
                break
    net.eval()
    return accuracy(net, None, "test")


if __name__ == "__main__":      # python3 programs/darts.py RUN_DIR...: the architectures they found
    import sys
    for folder in sys.argv[1:]:
        derive(folder)
