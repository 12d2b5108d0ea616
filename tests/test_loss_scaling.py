"""fp16 loss scaling in the engine, exercised on the CPU with a GradScaler forced on
(the real one is enabled only for fp16 on CUDA, which no test machine here has)."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("method", [None, "finite_diff(eps=0.01)", "sama(eps=0.01)", "cg(iters=3)",
                                    "itd(steps=2)"])
def test_scaled_hypergradient_steps_equal_unscaled_ones(method):
    """An upper problem's step with a loss scaler: the top loss is scaled before anything is
    differentiated, and since every BR-VJP is homogeneous of degree one in its adjoint,
    scaling by a power of two and unscaling gives exactly the unscaled step, for every
    kind of method (the program's own neumann, finite differences, sama, cg, unrolled)."""
    sets = [] if method is None else [f"weights->net.hypergrad={method}"]

    def run(scaler):
        prog = mloc.load(SMALL, set=sets)
        prog.program.live["weights"].scaler = scaler
        for _ in range(4):
            prog.program.outer_step()
        prog.program.guard.check()
        return prog.program

    plain = run(None)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaled = run(scaler)
    assert scaler.get_scale() == 2.0**12                       # nothing overflowed
    for name in ("weights", "net"):
        a, b = plain.live[name].problem.params, scaled.live[name].problem.params
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name
    assert not all(torch.equal(x, y) for x, y in zip(plain.live["weights"].problem.params,
                                                      mloc.load(SMALL, set=sets).program.live["weights"].problem.params))


def test_an_overflowing_hypergradient_step_is_skipped_and_the_scale_halved():
    prog = mloc.load(SMALL)
    program = prog.program
    lv = program.live["weights"]
    lv.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    program.lower_step("net")
    with torch.no_grad():
        for p in program.live["net"].problem.params:
            p.mul_(100)                       # a top loss of ~100s: × 2^127 it overflows
    kept = [p.clone() for p in lv.problem.params]
    program.upper_step("weights")
    assert lv.scaler.get_scale() == 2.0**126
    assert all(torch.equal(a, b) for a, b in zip(kept, lv.problem.params))   # the step was skipped
    program.guard.check()                                                    # and it is no NaN error
    for _ in range(40):                                                      # the scale comes down
        program.lower_step("net")
        program.upper_step("weights")
    assert lv.scaler.get_scale() < 2.0**126
    assert not all(torch.equal(a, b) for a, b in zip(kept, lv.problem.params))
