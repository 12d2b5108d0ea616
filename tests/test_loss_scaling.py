"""fp16 loss scaling in the engine, exercised on the CPU with a GradScaler forced on
(the real one is enabled only for fp16 on CUDA, which no test machine here has)."""

from __future__ import annotations

import torch

import mloc
from tests.test_run import SMALL


def _lower_steps(scaler, steps=6):
    prog = mloc.load(SMALL)
    lv = prog.program.live["net"]
    lv.scaler = scaler
    for _ in range(steps):
        prog.program.lower_step("net")
    return prog, lv


def test_scaled_steps_equal_unscaled_ones():
    # scaling by a power of two and back is exact in binary floating point
    _, plain = _lower_steps(None)
    _, scaled = _lower_steps(torch.amp.GradScaler("cpu", init_scale=2.0**12))
    assert all(torch.equal(a, b) for a, b in zip(plain.problem.params, scaled.problem.params))


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    prog = mloc.load(SMALL)
    lv = prog.program.live["net"]
    with torch.no_grad():
        lv.problem.params[2].mul_(100)        # gradients well above 1: × 2^127 they overflow
    lv.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    kept = [p.clone() for p in lv.problem.params]
    prog.program.lower_step("net")
    assert lv.scaler.get_scale() == 2.0**126
    assert all(torch.equal(a, b) for a, b in zip(kept, lv.problem.params))   # the step was skipped
    prog.program.guard.check()                                             # and it is no NaN error
    for _ in range(40):                                                    # the scale comes down
        prog.program.lower_step("net")
    assert lv.scaler.get_scale() < 2.0**126
    assert not all(torch.equal(a, b) for a, b in zip(kept, lv.problem.params))
