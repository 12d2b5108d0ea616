"""The optimizer update inside a compiled step's graph (``mloc.runtime.compiled.fused``),
checked fast: the captured graph is replayed as it is (its FX code, eagerly) instead of
being handed to TorchInductor, so what is tested is the capture, the lifted step count,
the in-place writes and the state rebuilt after them; ``test_compiled_steps`` compares the
Inductor-compiled steps with eager ones (slow tier, and one program in the default tier)."""

from __future__ import annotations

import pytest
import torch

import mloc
from mloc.runtime.base import tree
from mloc.runtime.compiled import step as step_module
from mloc.runtime.compiled.fused import _into
from tests.conftest import ROOT

SMALL = ROOT / "tests" / "run" / "small.mlo"


def _replayed(graph, counts):
    """The captured graph as it is (no compiler), counted as one compile."""
    def run(*inputs):
        if not counts.compiles:
            counts.compiles = 1
        with torch.no_grad():
            return graph(*inputs)
    return run


@pytest.mark.parametrize("optimizer", ["adam(lr=0.01)", "sgd(lr=0.1, momentum=0.9)"])
def test_the_update_runs_in_the_graph_in_place_with_the_eager_state_layout(monkeypatch, optimizer):
    """Per lower step, from the same state: the fused step's parameters equal the eager step's to
    1e-12 (float64: the same operations, functional against in-place kernels), its state
    is the eager state's type with a Python int count equal to eager's, and the state's
    tensors (Adam's moments, SGD's momentum) are the ones it had before: written in place."""
    monkeypatch.setattr(step_module, "compile_graph", _replayed)
    sets = [f"net.optimizer={optimizer}"]
    eager = mloc.load(SMALL, set=sets, dtype="float64", compile="off")
    fused = mloc.load(SMALL, set=sets, dtype="float64", compile="on")
    for i in range(3):
        fused.program.load_state_dict(eager.program.state_dict())
        before = {n: tree.tensors(lv.problem.state) for n, lv in fused.program.live.items()}
        for session in (eager, fused):
            session.program.draw("weights")         # what a step of the program draws first
            session.program.lower_step("net")
        for name, lv in fused.program.live.items():
            ref = eager.program.live[name].problem
            for a, b in zip(ref.params, lv.problem.params):
                assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-12, (i, name)
            assert type(lv.problem.state) is type(ref.state)
            assert type(lv.problem.state.count) is int and lv.problem.state.count == ref.state.count
            now = tree.tensors(lv.problem.state)
            if i > 0:           # SGD's first step makes its momentum buffer; after that, in place
                assert all(a is b for a, b in zip(now, before[name])), name
    reports = {r.kind + " " + r.name: r for r in fused.program.compiling.ran()}
    assert set(reports) == {"lower net"}, [r.line() for r in reports.values()]
    assert all(r.fused and r.compiled for r in reports.values()), [r.line() for r in reports.values()]
    assert "the optimizer update in the graph" in reports["lower net"].line()


def test_a_state_is_written_in_place_only_where_its_tensors_pair_up():
    old = (3, (torch.zeros(2), torch.zeros(3)))
    new = (4, (torch.ones(2), torch.full((3,), 2.0)))
    out = _into(old, new)
    assert out[0] == 4 and out[1][0] is old[1][0] and out[1][1] is old[1][1]
    assert old[1][1].tolist() == [2.0, 2.0, 2.0]
    grown = (4, (torch.ones(2), torch.ones(4)))             # a new layout: the new tensors, nothing written
    assert _into(old, grown) is grown and old[1][0].tolist() == [1.0, 1.0]
    a, b = torch.zeros(2), torch.ones(2)
    swapped = (4, (b, a))                                   # an old tensor at another place: not paired
    assert _into((3, (a, b)), swapped) is swapped and a.tolist() == [0.0, 0.0]


def test_a_step_where_a_parameter_got_no_gradient_keeps_the_update_apart_and_compiled(monkeypatch):
    """``first_order``: the upper's loss does not read its own parameters, so none gets a
    gradient; its state must stay as it was (as ``torch.optim`` skips a ``.grad`` of None),
    which the update in the graph does not model: the graph is the gradient's alone, still
    compiled, the commit runs after it, and the report says why."""
    from mloc.runtime.compiled.fused import ABSENT
    monkeypatch.setattr(step_module, "compile_graph", _replayed)
    sets = ["weights->net.hypergrad=first_order"]
    eager = mloc.load(SMALL, set=sets, dtype="float64", compile="off")
    split = mloc.load(SMALL, set=sets, dtype="float64", compile="on")
    split.program.live["weights"].compiled_step = None        # the eager commit: no Dynamo compile here
    for session in (eager, split):
        session.step()
        session.step()
    report = split.program.compiling.reports["upper", "weights"]
    assert report.compiled and not report.fused and report.split == ABSENT, report.line()
    for name, lv in split.program.live.items():
        ref = eager.program.live[name].problem
        assert lv.problem.state.count == ref.state.count
        for a, b in zip(ref.params, lv.problem.params):
            assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-12, name
