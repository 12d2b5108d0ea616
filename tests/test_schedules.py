"""`multistep` and any `torch.optim.lr_scheduler` class as a schedule (docs/language.md,
"Built-in schedules"), against torch's schedulers stepped by hand.

A schedule is a factor of the problem's `lr`: mloc's rate at step k is `lr · factor(k)`,
held in a 0-dim tensor the engine rewrites before each commit. torch's chainable
schedulers instead multiply the previous rate (`MultiStepLR`: `lr·γ·γ` where mloc has
`lr·γ²`), so the rates agree to the last bit or two, and exactly when every product is
exact (γ = 0.5 and a learning rate that is a power of two, as below). The engine
(mloc/runtime/program/build.py) holds a scheduled rate in a tensor of the default dtype, float32,
so a rate not representable in float32 (0.05) is rounded there: those runs agree with the
hand loop to 1e-7, not bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

import mloc
from mloc.runtime.program.schedules import multistep, torch_schedule
from tests.test_torch_optim import QUAD, hand, radam, run

LRS = "torch.optim.lr_scheduler"


def rates(make, base: float, n: int) -> list[float]:
    """The rate a hand-written loop uses at each of its first n steps."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched, out = make(opt), []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def ulps(a: float, b: float) -> float:
    return abs(a - b) / math.ulp(b)


@pytest.mark.parametrize("gamma", [0.1, 0.5, 0.3])
def test_multistep_is_MultiStepLR(gamma):
    want = rates(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [3, 7, 8], gamma), 0.05, 12)
    factor = multistep((3, 7, 8), gamma)
    got = [0.05 * factor(k) for k in range(12)]
    assert all(ulps(a, b) <= 2 for a, b in zip(got, want))
    assert [factor(k) for k in (0, 2, 3, 6, 7, 8, 11)] == [1, 1, gamma, gamma, gamma**2, gamma**3, gamma**3]


@pytest.mark.parametrize("cls,options", [
    ("CosineAnnealingWarmRestarts", {"T_0": 3, "T_mult": 2, "eta_min": 0.001}),
    ("OneCycleLR", {"max_lr": 0.2, "total_steps": 20}),
    ("StepLR", {"step_size": 4, "gamma": 0.5}),
    ("LinearLR", {"start_factor": 0.25, "total_iters": 6}),
    ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 3}),
])
def test_a_torch_scheduler_gives_its_own_rates(cls, options):
    want = rates(lambda o: getattr(torch.optim.lr_scheduler, cls)(o, **options), 0.05, 20)
    factor = torch_schedule(f"{LRS}:{cls}", options, base=0.05)
    got = [0.05 * factor(k) for k in range(20)]
    assert all(ulps(a, b) <= 1 for a, b in zip(got, want)), (got, want)
    assert factor(3) == factor(3)                  # remembered, not stepped again


def test_without_a_class_the_rate_is_constant():
    assert [torch_schedule(None)(k) for k in (0, 10)] == [1.0, 1.0]


def test_a_scheduler_that_reads_a_metric_is_refused():
    with pytest.raises(ValueError, match="metrics"):
        torch_schedule(f"{LRS}:ReduceLROnPlateau", {}, base=0.1)


# --- in a program -----------------------------------------------------------------------

def test_multistep_drives_a_builtin_optimizer():
    """sgd with momentum and multistep against torch.optim.SGD with MultiStepLR (1e-7: the
    float32 rate tensor, see the module docstring)."""
    w, h, _ = run(4, "model.optimizer=sgd(lr=0.05, momentum=0.5)",
                  "model.schedule=multistep(milestones=[4, 7], gamma=0.3)")
    rw, rh = hand(4, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5), radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [4, 7], 0.3))
    assert torch.allclose(w, rw, rtol=1e-7, atol=0) and torch.allclose(h, rh, rtol=1e-7, atol=0)
    assert not torch.allclose(w, hand(4, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5),
                                      radam(0.02))[0], rtol=1e-4, atol=0)   # it changes the result


def test_multistep_drives_a_torch_optimizer_bit_for_bit():
    w, h, _ = run(4, "model.optimizer=torch.optim.RAdam(lr=0.0625, betas=(0.8, 0.99))",
                  "model.schedule=multistep(milestones=[2, 5, 9], gamma=0.5)")
    rw, rh = hand(4, radam(0.0625, betas=(0.8, 0.99)), radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5, 9], 0.5))
    assert torch.equal(w, rw) and torch.equal(h, rh)


@pytest.mark.parametrize("spelling", [
    f"{LRS}.StepLR(step_size=2, gamma=0.5)",
    "quad.make_scheduler(every=2)",
    f"torch(cls={LRS}.StepLR, step_size=2, gamma=0.5)",
])
def test_a_torch_scheduler_drives_a_torch_optimizer_bit_for_bit(spelling):
    w, h, _ = run(4, "model.optimizer=torch.optim.RAdam(lr=0.0625, betas=(0.8, 0.99))",
                  f"model.schedule={spelling}")
    rw, rh = hand(4, radam(0.0625, betas=(0.8, 0.99)), radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5))
    assert torch.equal(w, rw) and torch.equal(h, rh)


def test_a_cosine_restart_schedule_agrees_to_rounding():
    w, h, _ = run(4, f"model.schedule={LRS}.CosineAnnealingWarmRestarts(T_0=5, eta_min=0.01)")
    rw, rh = hand(4, radam(0.05, betas=(0.8, 0.99)), radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 5, eta_min=0.01))
    assert torch.allclose(w, rw, rtol=1e-7, atol=0) and torch.allclose(h, rh, rtol=1e-7, atol=0)


def test_the_schedule_resumes_from_a_checkpoint(tmp_path):
    sets = [f"model.schedule={LRS}.StepLR(step_size=2, gamma=0.5)"]
    first = mloc.load(QUAD, set=sets, dtype="float64")
    first.run(2)
    first.save(tmp_path / "c.pt")
    again = mloc.load(QUAD, set=sets, dtype="float64")
    again.restore(tmp_path / "c.pt")
    first.run(2)
    again.run(2)
    assert torch.equal(first.module("model").w, again.module("model").w)
