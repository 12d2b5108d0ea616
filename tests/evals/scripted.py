"""A program whose evaluations return scripted values, for the selection tests.

`Counter` has one parameter w; `climb` has gradient -1, so plain SGD with lr = 1 makes
w = k after k steps, exactly (small integers are exact in float32). `scripted` returns
`values[k - 1]` at step k (and `values[0]` on the initial modules, k = 0), so a test knows
the value every evaluation reports.
"""

import torch
from torch import nn


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))


def batches(n: int = 4):
    return [torch.ones(1) for _ in range(n)]


def climb(counter, batch):
    return -(counter.w * batch).sum()


def step_of(counter) -> int:
    return int(round(float(counter.w)))


def scripted(counter, values):
    """The value scripted for the current step (a string in `values` is returned as is)."""
    return values[max(step_of(counter), 1) - 1]


def scripted_dict(counter, values):
    return {"top1": scripted(counter, values), "step": float(step_of(counter))}


def raising_at(counter, at: int = 3):
    if step_of(counter) >= at:
        raise ValueError(f"evaluation data missing at step {step_of(counter)}")
    return 0.5
