"""A checkpoint holds each parameter once (:mod:`mloc.runtime.program.clones`): a problem's
``params`` and its ``module`` entries refer to the same copies, tied parameters are one
copy, a parameter that is not the module's (an `init` problem's ``δ``) keeps its own; the
file is the bytes of the distinct tensors plus a small overhead; and a checkpoint in the
former layout (separate copies) still restores bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

import mloc
from mloc.runtime.base import tree
from mloc.runtime.optim import sgd
from mloc.runtime.program.checkpoint import load_checkpoint, save_checkpoint
from mloc.runtime.program.clones import Clones
from mloc.runtime.program.state import restore, snapshot
from tests.test_run import SMALL

WIDE = ("net.module.width=32768",)          # `net`: 8·32768 + 3 float32 parameters, 1 MiB


def _bytes(tensors) -> int:
    """Bytes of the distinct tensors among ``tensors`` (each counted once by identity)."""
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def test_the_checkpoint_file_holds_each_parameter_once(tmp_path):
    s = mloc.load(SMALL, set=WIDE)
    s.run(2)
    live = s.program.live.values()
    params = _bytes(p for lv in live for p in lv.module.parameters())
    buffers = _bytes(b for lv in live for b in lv.module.buffers())
    optimizer = _bytes(t for lv in live for t in tree.tensors(lv.problem.state))
    assert params > 2**20 and optimizer > 2**20          # sgd's momentum: one more copy of `net`
    s.save(tmp_path / "c.pt")
    size = (tmp_path / "c.pt").stat().st_size
    held = params + buffers + optimizer
    # at least every byte once; at most a small overhead (names, RNG and data state, zip
    # alignment) on top: a second copy of the parameters would be one more MiB
    assert held <= size < 1.02 * held + 64 * 1024, (size, held)
    state = load_checkpoint(tmp_path / "c.pt", s.program.name)["problems"]["net"]
    assert [p.untyped_storage().data_ptr() for p in state["params"]] \
        == [state["module"][k].untyped_storage().data_ptr() for k in ("net.0.weight", "net.0.bias",
                                                                      "net.2.weight", "net.2.bias")]


def _former(state: dict) -> dict:
    """``state`` as the code before wrote it: every entry its own copy."""
    problems = {n: {**p, "params": [t.clone() for t in p["params"]],
                    "module": {k: v.clone() for k, v in p["module"].items()}}
                for n, p in state["problems"].items()}
    return {**state, "problems": problems}


def _final(session) -> list[torch.Tensor]:
    return [t.detach().clone() for lv in session.program.live.values()
            for t in (*lv.problem.params, *lv.module.state_dict().values(), *tree.tensors(lv.problem.state))]


def test_both_layouts_resume_bitwise_as_an_uninterrupted_run(tmp_path):
    whole = mloc.load(SMALL)
    whole.run(7)
    first = mloc.load(SMALL)
    first.run(3)
    state = first.program.state_dict()
    save_checkpoint(tmp_path / "new.pt", state, first.program.name)
    save_checkpoint(tmp_path / "old.pt", _former(state), first.program.name)
    assert (tmp_path / "old.pt").stat().st_size > (tmp_path / "new.pt").stat().st_size
    for name in ("new.pt", "old.pt"):
        resumed = mloc.load(SMALL)
        resumed.restore(tmp_path / name)
        resumed.run(4)
        got, want = _final(resumed), _final(whole)
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), name


class _Tied(nn.Module):
    """An embedding tied to its output layer, and a buffer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("count", torch.arange(4.0))


def _live(module: nn.Module, params: tuple) -> SimpleNamespace:
    problem = SimpleNamespace(params=params, optimizer=sgd(0.1, momentum=0.9))
    problem.state = problem.optimizer.init(params)
    return SimpleNamespace(shards=None, problem=problem, module=module, steps=4)


def test_tied_free_and_view_parameters(tmp_path):
    torch.manual_seed(0)
    tied, free = _Tied(), nn.Parameter(torch.randn(3))
    view = tied.embed.weight.view(-1)[:6]                 # another view of a parameter: its own copy
    live = {"a": _live(tied, (tied.embed.weight,)), "b": _live(nn.Linear(2, 2), (free, view))}
    state = snapshot("p", 4, live, {})
    a, b = state["problems"]["a"], state["problems"]["b"]
    assert a["module"]["embed.weight"] is a["module"]["out.weight"] is a["params"][0]
    assert a["module"]["count"] is not a["params"][0]
    assert all(t is not v for t in b["params"] for v in b["module"].values())
    assert torch.equal(b["params"][1], view) and b["params"][1].untyped_storage().nbytes() == 6 * 4
    save_checkpoint(tmp_path / "c.pt", state, "p")
    loaded = load_checkpoint(tmp_path / "c.pt", "p")
    with torch.no_grad():                                  # then put the saved state back
        expected = [t.detach().clone() for t in (tied.embed.weight, tied.count, free)]
        for t in (tied.embed.weight, tied.count, free):
            t.add_(1.0)
    restore(loaded, live, {})
    assert tied.out.weight is tied.embed.weight
    assert all(torch.equal(a, b) for a, b in zip((tied.embed.weight, tied.count, free), expected))


def test_clones_copy_each_distinct_tensor_once():
    calls = []
    clones = Clones(lambda t: calls.append(t) or t.detach().clone())
    p, q = torch.randn(4, 3), torch.randn(4, 3)
    assert clones(p) is clones(p.detach()) is clones(p[:])        # the same view, fresh objects
    assert clones(q) is not clones(p) and clones(p.t()) is not clones(p)
    e = torch.empty(0)
    assert clones(e) is not clones(e)                              # an empty tensor is never shared
    assert len(calls) == 5
    assert torch.equal(clones(p), p) and clones(p).untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
