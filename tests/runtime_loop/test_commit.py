"""The commit pipeline: only the stages that apply are built, every source feeds the same
one, and a new source slots in beside the two the engine has."""

from __future__ import annotations

import torch

import mloc
from mloc.runtime.grad.sources import plain_gradient
from tests.test_run import SMALL


def _stepped(*sets, scaler=None):
    prog = mloc.load(SMALL, set=list(sets))
    if scaler is not None:
        prog.program.live["weights"].scaler = scaler
        prog.program.live["net"].scaler = scaler
    prog.program.outer_step()
    return prog.program


def test_an_fp32_single_process_pipeline_is_the_watch_and_the_commit():
    program = _stepped()
    for name in ("net", "weights"):
        pipeline = program.live[name].pipeline
        assert pipeline.stages == ("finite", "commit", "committed")
        assert pipeline.seed is None and not pipeline.on_grad


def test_clipping_and_loss_scaling_act_on_grad_in_order():
    program = _stepped("net.clip_grad_norm=0.5")
    assert program.live["net"].pipeline.stages == (".grad", "clip", "finite", "commit", "committed")
    assert program.live["weights"].pipeline.stages == ("finite", "commit", "committed")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    program = _stepped("net.clip_grad_norm=0.5", scaler=scaler)
    net = program.live["net"].pipeline
    assert net.stages == (".grad", "unscale", "clip", "finite", "commit", "committed")
    assert net.seed == scaler.scale and net.on_grad
    assert all(p.grad is None for lv in program.live.values() for p in lv.problem.params)


def test_one_pipeline_per_problem_built_once():
    program = _stepped()
    built = {name: lv.pipeline for name, lv in program.live.items()}
    program.outer_step()
    assert all(program.live[name].pipeline is p for name, p in built.items())


def test_a_new_source_feeds_the_same_pipeline():
    """Any ``source(seed) -> (grads, loss)`` commits through a problem's pipeline: the
    plain gradient of the lower loss, fed by hand, makes exactly the engine's step."""
    engine, by_hand = _stepped(), _stepped()
    engine.lower_step("net")
    lv = by_hand.live["net"]
    by_hand.draw("net")
    source = plain_gradient(lv.problem.params, lv.problem.loss.step_loss(None), lv.autocast)
    grads, loss = source(lv.pipeline.seed)
    steps = lv.steps
    lv.pipeline.run(grads, loss)
    assert lv.steps == steps + 1 and lv.last_loss is loss
    for a, b in zip(engine.live["net"].problem.params, lv.problem.params):
        assert torch.equal(a, b)
    by_hand.guard.check()
