"""MAML on sinusoid regression (Finn et al., 2017).

Each task is y = a·sin(x − φ) with amplitude a ∈ [0.1, 5] and phase φ ∈ [0, π]. The lower
problem adapts a copy of the meta-network to one task's support set with a few SGD steps;
the upper problem moves the shared initialisation so that the adapted network does well on
the same task's query set.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


class SineNet(nn.Module):
    def __init__(self, hidden: int = 40):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SineTasks:
    """An endless stream of tasks; task t's batch is yielded `repeat` times in a row, so a
    support stream with repeat = unroll and a query stream with repeat = 1 stay aligned."""

    def __init__(self, split: str, shots: int, repeat: int, seed: int):
        if split not in ("support", "query"):
            raise ValueError(f"split must be 'support' or 'query', got {split!r}")
        self.split, self.shots, self.repeat, self.seed = split, shots, repeat, seed

    def task(self, t: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + t)
        amp, phase = torch.rand(2, generator=g, dtype=torch.float64).tolist()
        return 0.1 + 4.9 * amp, math.pi * phase

    def batch(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        amp, phase = self.task(t)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + t + (0 if self.split == "support" else 7_919))
        x = torch.rand(self.shots, 1, generator=g) * 10 - 5
        return x, amp * torch.sin(x - phase)

    def __iter__(self):
        t = 0
        while True:
            b = self.batch(t)
            for _ in range(self.repeat):
                yield b
            t += 1


def sine_tasks(split: str = "support", shots: int = 10, repeat: int = 1, seed: int = 0) -> SineTasks:
    return SineTasks(split, shots, repeat, seed)


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


@torch.no_grad()
def zero_shot_error(model: nn.Module, tasks: SineTasks, n_tasks: int = 20) -> float:
    """Query MSE of the meta-initialisation before adaptation, averaged over held-out tasks."""
    it = iter(tasks)
    return sum(mse(model, next(it)).item() for _ in range(n_tasks)) / n_tasks


def adapted_error(model: nn.Module, support: SineTasks, query: SineTasks, steps: int = 5, lr: float = 0.01,
                  lam: float = 0.0, n_tasks: int = 20) -> float:
    """Query MSE after adaptation, averaged over held-out tasks: what MAML and iMAML optimise
    and how their papers evaluate (Finn et al., 2017, Fig. 2; Rajeswaran et al., 2019).
    For each task t, a copy of ``model`` takes ``steps`` SGD steps at ``lr`` on t's support
    set, on ``mse`` plus ``(lam/2)·‖θ − φ‖²`` toward the evaluated weights φ (iMAML's inner
    objective when ``lam > 0``), then its MSE on t's query set is read. ``support`` and
    ``query`` must be built alike (same seed, repeat=1), so that their t-th batches are the
    same task's. ``model`` itself is left as it was."""
    total, supports, queries = 0.0, iter(support), iter(query)
    for _ in range(n_tasks):
        theta = copy.deepcopy(model)
        phi = [p.detach() for p in model.parameters()]
        batch = next(supports)
        with torch.enable_grad():
            for _ in range(steps):
                loss = mse(theta, batch)
                if lam:
                    loss = loss + 0.5 * lam * sum((p - q).pow(2).sum() for p, q in zip(theta.parameters(), phi))
                grads = torch.autograd.grad(loss, list(theta.parameters()))
                with torch.no_grad():
                    for p, g in zip(theta.parameters(), grads):
                        p.sub_(lr * g)
        with torch.no_grad():
            total += mse(theta, next(queries)).item()
    return total / n_tasks


def proximal_mse(model: nn.Module, meta: nn.Module, batch, lam: float = 2.0) -> torch.Tensor:
    """iMAML's inner objective: the task loss plus (λ/2)‖θ − φ‖², which keeps the adapted
    weights θ near the meta-initialisation φ (Rajeswaran et al., NeurIPS 2019, eq. 4)."""
    prox = sum((p - q).pow(2).sum() for p, q in zip(model.parameters(), meta.parameters()))
    return mse(model, batch) + 0.5 * lam * prox
