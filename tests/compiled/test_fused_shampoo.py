"""Shampoo's update inside a compiled step's graph between root refreshes
(``mloc.runtime.optim.shampoo_compiled``), checked fast as ``test_fused`` checks the others:
the captured graphs replayed as they are (no Inductor), the commit on root steps eager, so
what is tested is the capture (roots and statistics as inputs, the statistics written in
place), the choice per step between the fused graph and the graph plus commit, and the
state after. ``test_compiled_steps`` compares the Inductor-compiled steps (slow tier)."""

from __future__ import annotations

import pytest
import torch

import mloc
from mloc.runtime.base import tree
from mloc.runtime.compiled import step as step_module
from mloc.runtime.optim.shampoo_compiled import APART, ASYNC
from tests.compiled.test_fused import SMALL, _replayed

VARIANTS = {
    "adam graft, blocks": "shampoo(lr=0.01, graft=adam, block_size=4, update_every=3, start_preconditioning_step=4)",
    "stale, nesterov": ("shampoo(lr=0.01, graft=rmsprop, update_every=2, staleness=3, momentum=0.9, nesterov=true, "
                        "start_preconditioning_step=2)"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shampoo_fuses_between_root_steps_and_commits_apart_on_them(monkeypatch, variant):
    """Per lower step, from the eager state: parameters and the whole state (statistics,
    roots, accumulators, momentum, pending slots) equal eager's to 1e-12 relative
    (float64), the count is eager's int; the steps without root work ran the update in the
    graph (the state's tensors written in place), those with it the commit after the graph;
    a root install changes no graph (the roots are inputs): after the start of
    preconditioning no new graph, whatever the refreshes."""
    monkeypatch.setattr(step_module, "compile_graph", _replayed)
    sets = [f"net.optimizer={VARIANTS[variant]}"]
    eager = mloc.load(SMALL, set=sets, dtype="float64", compile="off")
    fused = mloc.load(SMALL, set=sets, dtype="float64", compile="on")
    fused.program.live["net"].compiled_step = None      # the eager commit on root steps: no Dynamo here
    optimizer = fused.program.live["net"].problem.optimizer
    report, kinds, graphs = fused.program.compiling, set(), []
    for i in range(12):
        fused.program.load_state_dict(eager.program.state_dict())
        state = fused.program.live["net"].problem.state
        apart = optimizer.host_work(state)
        kinds.add(apart)
        before = tree.tensors(state.stats)
        for session in (eager, fused):
            session.program.draw("weights")
            session.program.lower_step("net")
        ref, got = eager.program.live["net"].problem, fused.program.live["net"].problem
        for a, b in zip(ref.params, got.params):
            assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-12, i
        assert type(got.state.count) is int and got.state.count == ref.state.count == i + 1
        for a, b in zip(tree.tensors(ref.state), tree.tensors(got.state)):
            scale = a.abs().max().clamp_min(1e-30) if a.is_floating_point() else 1
            assert (a - b).abs().max() / scale <= 1e-12, i
        if not apart:
            assert all(a is b for a, b in zip(before, tree.tensors(got.state.stats))), i
        graphs.append(report.reports["lower", "net"].graphs)
    assert kinds == {True, False}
    assert graphs[-1] == graphs[5] == 3      # before and after the start, and the gradient's alone
    r = report.reports["lower", "net"]
    assert r.fused and r.compiled and r.apart == APART, r.line()
    assert "the optimizer update in the graph (steps that install or refresh" in r.line()


def test_async_roots_keep_the_update_apart_and_say_why(monkeypatch):
    monkeypatch.setattr(step_module, "compile_graph", _replayed)
    session = mloc.load(SMALL, set=["net.optimizer=shampoo(lr=0.01, staleness=2, async_roots=true)"],
                        dtype="float64", compile="on")
    session.program.live["net"].compiled_step = None
    session.program.draw("weights")
    session.program.lower_step("net")
    r = session.program.compiling.reports["lower", "net"]
    assert r.compiled and not r.fused and r.split == ASYNC, r.line()


SLOW = {
    "sgd graft, blocks, heavy ball": ("shampoo(lr=0.01, graft=sgd, block_size=4, update_every=4, momentum=0.9, "
                                      "nesterov=false, start_preconditioning_step=6)"),
    "adam graft, staleness 2": "shampoo(lr=0.01, graft=adam, update_every=3, staleness=2, start_preconditioning_step=5)",
    "adagrad graft, nesterov, coupled decay": ("shampoo(lr=0.01, graft=adagrad, update_every=5, momentum=0.9, "
                                               "nesterov=true, weight_decay=0.01, decoupled_weight_decay=false, "
                                               "start_preconditioning_step=3)"),
    "rmsprop graft": "shampoo(lr=0.01, graft=rmsprop, update_every=2, start_preconditioning_step=7)",
    "no graft, decoupled decay": ("shampoo(lr=0.001, graft=none, update_every=3, weight_decay=0.01, "
                                  "decoupled_weight_decay=true, start_preconditioning_step=4)"),
}
"""Shampoo settings under the lower problem, compiled (Inductor) against eager over 100
steps with ``test_compiled_steps``' bounds (float64 1e-12, each step from the eager state),
no graph compiled after the fifth outer step: refreshes every 2 to 5 steps, blocking,
staleness, every grafting kind, both momenta and weight decays, the start of
preconditioning crossed after the warmup's first steps."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(SLOW))
def test_shampoo_fused_compiled_equals_eager_over_100_steps_in_float64(variant):
    from tests.compiled.test_compiled_steps import _agree
    _agree("neumann(iters=3, alpha=0.1)", SLOW[variant], "float64", 100, 1e-12)
