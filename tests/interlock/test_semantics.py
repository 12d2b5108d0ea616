"""Interlocking backpropagation in one process (the simulation) against closed forms and
hand-written loops, in float64.

- The reference's hand-checkable case (``../shared/reference/interlocking.md``; worked in
  ``hand.py``) after one SGD step of lr 1: end-to-end (n = 3) gives 0.8, 2.2, 3.4; local
  (n = 1) [1.5, 2.5], [2.0, 4.0], [3.4, 3.4]; pairwise (n = 2) [0.5, 3.5], [2.2, 2.2],
  [3.4, 3.4]. Every number is a sum of at most a few products of exact binary fractions
  and 0.1, so float64 gives them to 1e-15; 1e-12 is the tolerance.
- n = 1 against local learning and n = K against plain backpropagation, both written by
  hand here with torch.optim.SGD (momentum 0.9), 10 steps on a 3-stage tanh network with
  linear heads, float64, 1e-12 (observed: bit-for-bit or a few ulps).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools

import pytest
import torch

import mloc
from tests.interlock.programs import HAND, HERE, NET, write

STATED = {3: [[0.8, 0.8], [2.2, 2.2], [3.4, 3.4]],
          1: [[1.5, 2.5], [2.0, 4.0], [3.4, 3.4]],
          2: [[0.5, 3.5], [2.2, 2.2], [3.4, 3.4]]}


@pytest.mark.parametrize("n", [3, 1, 2], ids=["end-to-end", "local", "pairwise"])
def test_the_hand_checkable_case_gives_the_stated_parameters(tmp_path, n):
    prog = mloc.load(write(tmp_path, HAND, n=n), dtype="float64")
    prog.step()
    got = [v for k in (1, 2, 3) for v in prog.module(f"stage{k}").w.detach().tolist()]
    assert got == pytest.approx([v for pair in STATED[n] for v in pair], abs=1e-12, rel=0)


def _hand_module():
    spec = importlib.util.spec_from_file_location("hand_reference", HERE / "hand.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference(n: int, steps: int) -> list[torch.nn.Module]:
    """The hand-written loop: same seed, same modules in the same order, same batches."""
    h = _hand_module()
    torch.manual_seed(0)
    stages = [h.Block(5, 7), h.Block(7, 6), h.Block(6, 4)]
    for s in stages:
        s.double()
    opts = [torch.optim.SGD(s.parameters(), lr=0.1, momentum=0.9) for s in stages]
    loader = h.blobs(16)
    batches = (b for _ in itertools.count() for b in loader)      # reshuffled every epoch
    for _ in range(steps):
        x, y = next(batches)
        x = x.double()
        for o in opts:
            o.zero_grad(set_to_none=True)
        if n == 1:                      # local learning: each stage on its own head, input detached
            hin = x
            for s in stages:
                out = s(hin.detach())
                torch.nn.functional.cross_entropy(s.head(out), y).backward()
                hin = out
        else:                           # end-to-end: the last head's loss through every stage
            out = x
            for s in stages:
                out = s(out)
            torch.nn.functional.cross_entropy(stages[-1].head(out), y).backward()
        for o in opts:
            o.step()
    return stages


@pytest.mark.parametrize("n", [1, 3], ids=["n=1 is local learning", "n=K is backpropagation"])
def test_extremes_equal_local_learning_and_backpropagation(tmp_path, n):
    prog = mloc.load(write(tmp_path, NET, n=n, opt="sgd(lr=0.1, momentum=0.9)"), dtype="float64")
    prog.run(10)
    ref = _reference(n, 10)
    worst = 0.0
    for k, r in enumerate(ref, 1):
        mine = dict(prog.module(f"stage{k}").named_parameters())
        for name, p in r.named_parameters():
            worst = max(worst, (mine[name].detach() - p.detach()).abs().max().item())
    assert worst <= 1e-12
    # the heads below the last are pruned at n = K: never trained
    if n == 3:
        fresh = _reference(n, 0)
        assert torch.equal(prog.module("stage1").head.weight.detach(), fresh[0].head.weight.detach())


def test_monitored_heads_train_on_their_own_loss_and_train_no_stage(tmp_path):
    """n = K with `monitor`: the pruned heads (stages 1, 2) are evaluated and trained on
    their detached features; every stage's main parameters are those of the pruned run."""
    path = write(tmp_path, NET, n=3, opt="sgd(lr=0.1, momentum=0.9)")
    pruned, watched = mloc.load(path, dtype="float64"), mloc.load(path, dtype="float64")
    chain = watched.program.chains["stage1"]
    watched.program.chains["stage1"] = dataclasses.replace(chain, monitor=True)
    before = watched.module("stage1").head.weight.detach().clone()
    pruned.run(3)
    watched.run(3)
    for k in (1, 2, 3):
        a, b = pruned.module(f"stage{k}").block, watched.module(f"stage{k}").block
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert torch.equal(pruned.module("stage1").head.weight, before)
    assert not torch.equal(watched.module("stage1").head.weight, before)
    assert torch.equal(pruned.module("stage3").head.weight, watched.module("stage3").head.weight)
