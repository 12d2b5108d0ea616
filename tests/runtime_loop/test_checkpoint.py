"""Checkpoints: atomic writes, every bad file is a CheckpointError, exact state round trips."""

from __future__ import annotations

import os
import random

import pytest
import torch

from mloc.runtime.program import checkpoint as ckpt
from mloc.runtime.program.checkpoint import (CheckpointError, capture_rng, load_checkpoint, restore_rng,
                                     save_checkpoint, state_to_tree, tree_to_state)
from mloc.runtime.optim import adam, sgd


def payload(v=1.0):
    return {"step": 3, "params": [torch.full((2, 2), v)], "name": "x", "pair": (1, None), "lr": 0.1}


def test_round_trip(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, payload(), "prog")
    got = load_checkpoint(path, "prog")
    assert got["step"] == 3 and got["name"] == "x" and got["pair"] == (1, None)
    assert torch.equal(got["params"][0], torch.full((2, 2), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]          # no temporary left behind


def test_a_crash_before_the_rename_leaves_the_old_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint(path, payload(1.0), "prog")
    before = path.read_bytes()

    def crash(src, dst):
        assert os.path.getsize(src) > 0                               # the new file was fully written
        raise KeyboardInterrupt                                       # killed between write and rename

    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, payload(2.0), "prog")
    assert path.read_bytes() == before
    assert torch.equal(load_checkpoint(path, "prog")["params"][0], torch.full((2, 2), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_a_payload_that_cannot_be_loaded_safely_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match=r"payload\['opt'\] is a SGDState.*state_to_tree"):
        save_checkpoint(tmp_path / "c.pt", {"opt": sgd(0.1).init((torch.ones(1),))}, "prog")
    with pytest.raises(TypeError, match="object"):
        save_checkpoint(tmp_path / "c.pt", {"x": object()}, "prog")
    assert not list(tmp_path.iterdir())


def expect_error(path, program="prog", match=""):
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, program)
    err = info.value
    assert str(path) in str(err) and err.help and "\n" not in str(err)
    # no traceback of another type chained to it
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)
    return err


def test_missing_file(tmp_path):
    assert "--resume" in expect_error(tmp_path / "nope.pt", match="does not exist").help


@pytest.mark.parametrize("keep", [0.5, 0.9, -1, 10])
def test_truncated_file(tmp_path, keep):
    path = tmp_path / "c.pt"
    save_checkpoint(path, payload(), "prog")
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (len(data) + keep if keep < 0 else keep)
    path.write_bytes(data[:n])
    err = expect_error(path, match="truncated or damaged")
    assert "earlier checkpoint" in err.help


def test_random_bytes(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(random.Random(0).randbytes(4096))
    expect_error(path, match="not a checkpoint")


def test_a_pickled_class_that_is_not_allowed(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"format": 1, "program": "prog", "payload": sgd(0.1).init((torch.ones(1),))}, path)
    expect_error(path, match="may not contain")


def test_wrong_format_version_program_and_shape(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"weights": torch.ones(1)}, path)
    expect_error(path, match="not an mloc checkpoint")
    torch.save({"format": 99, "program": "prog", "payload": {}}, path)
    expect_error(path, match="format 99")
    save_checkpoint(path, payload(), "other")
    expect_error(path, match="`other`, not `prog`")
    assert load_checkpoint(path, None)["step"] == 3


def run_steps(opt, params, state, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        grads = tuple(torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params)
        with torch.no_grad():
            state = opt.commit(grads, state, params)
    return state


@pytest.mark.parametrize("make", [lambda: sgd(0.1, momentum=0.9, nesterov=True), lambda: adam(1e-2)],
                         ids=["sgd-momentum", "adam"])
def test_optimizer_states_survive_a_checkpoint_bit_for_bit(tmp_path, make):
    opt = make()
    params = (torch.randn(3, 2, dtype=torch.float64), torch.randn(4))
    state = run_steps(opt, params, opt.init(params), 3, seed=1)
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"params": list(params), "opt": state_to_tree(state)}, "prog")
    loaded = load_checkpoint(path, "prog")
    params2 = tuple(p.clone() for p in loaded["params"])
    state2 = tree_to_state(loaded["opt"], opt.init(params2))
    assert type(state2) is type(state) and state2.count == state.count == 3
    for a, b in zip(state[1:], state2[1:]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # and training continues identically
    final, final2 = run_steps(opt, params, state, 2, seed=2), run_steps(opt, params2, state2, 2, seed=2)
    assert all(torch.equal(p, q) for p, q in zip(params, params2))
    assert all(torch.equal(x, y) for x, y in zip(final[1], final2[1]))


def test_a_state_that_does_not_match_the_program_is_reported():
    params = (torch.ones(3),)
    tree = state_to_tree(adam().init(params))
    expected = r"`opt.mu\[0\]` is \(3,\) torch.float32, the program's is \(4,\)"
    with pytest.raises(CheckpointError, match=expected):
        tree_to_state(tree, adam().init((torch.ones(4),)), "opt")
    with pytest.raises(CheckpointError, match="is not a SGDState"):
        tree_to_state(tree, sgd(0.1, momentum=0.9).init(params), "opt")


def test_rng_capture_and_restore_reproduces_the_next_numbers(tmp_path):
    random.seed(1)
    torch.manual_seed(1)
    random.gauss(0, 1)                       # leaves a cached gaussian in Python's state
    path = tmp_path / "rng.pt"
    save_checkpoint(path, {"rng": capture_rng()}, "prog")
    expected = ([random.random(), random.gauss(0, 1)], torch.rand(5), torch.randn(3))
    random.seed(99)
    torch.manual_seed(99)
    restore_rng(load_checkpoint(path, "prog")["rng"])
    got = ([random.random(), random.gauss(0, 1)], torch.rand(5), torch.randn(3))
    assert got[0] == expected[0]
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


def test_an_in_memory_state_dict_is_a_snapshot():
    """Commits overwrite optimizer buffers in place, so `state_dict()` copies them and
    `load_state_dict()` copies what it is given: a snapshot taken in memory stays as it was
    while training goes on, and restoring it twice replays the same steps bit for bit.
    Between steps no parameter holds a `.grad` (freed after each commit)."""
    import mloc
    from tests.test_run import SMALL

    prog = mloc.load(SMALL)
    prog.run(2)
    program = prog.program
    snap = program.state_dict()
    frozen = [t.clone() for lv in snap["problems"].values() for t in _tensors(lv["optimizer"])]
    assert frozen and any(t.abs().sum() > 0 for t in frozen)
    finals = []
    for _ in range(2):
        program.load_state_dict(snap)
        prog.run(3)
        now = [t for lv in snap["problems"].values() for t in _tensors(lv["optimizer"])]
        assert all(torch.equal(a, b) for a, b in zip(frozen, now))
        finals.append([p.detach().clone() for lv in program.live.values() for p in lv.problem.params])
        assert all(p.grad is None for lv in program.live.values() for p in lv.problem.params)
    assert all(torch.equal(a, b) for a, b in zip(*finals))


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []
