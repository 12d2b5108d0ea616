"""ZeRO's pieces on one process (default tier): the owner partition, cutting a whole
optimizer state into shards and joining them back (every registry optimizer's state, Shampoo's
pending root slots included), `auto`'s rule, and the `strategy` setting at both doors."""

from __future__ import annotations

import pytest
import torch

from mloc.builtins import OPTIMIZERS
from mloc.runtime.base import tree
from mloc.runtime.optim import adam, sgd, shampoo, shards, torch_optimizer
from mloc.runtime.optim.zero import Zero, ZeroState, _rebuilt
from mloc.shared.strategy import EASY, decide
from tests.conftest import PROGRAMS

REWEIGHTING = PROGRAMS / "data_reweighting.mlo"

BUILT = {"sgd": lambda: sgd(0.1, momentum=0.9), "adam": lambda: adam(0.01), "adamw": lambda: adam(0.01),
         "shampoo": lambda: shampoo(0.01, block_size=4, update_every=1, staleness=2),
         "torch": lambda: torch_optimizer(0.01, cls="torch.optim:RAdam")}


def test_owners_balance_whole_tensors_by_bytes_largest_first():
    # LPT: 9 -> r0, 7 -> r1, 5 -> r1 (7 < 9), 4 -> r0 (9 < 12), 3 -> r1 (12 < 13): loads 13, 15
    assert shards.owners([5, 9, 3, 7, 4], 2) == (1, 0, 1, 1, 0)
    assert shards.owners([1, 1, 1, 1], 4) == (0, 1, 2, 3)
    assert shards.owners([8], 3) == (0,)           # a rank may own nothing


def _stepped(name: str, params):
    opt = BUILT[name]()
    state = opt.init(params)
    with torch.no_grad():
        for k in range(3):
            state = opt.commit(tuple(torch.randn_like(p) for p in params), state, params)
    return opt, state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_state_cut_into_shards_joins_back_to_itself(name):
    assert set(BUILT) == set(OPTIMIZERS), "add the new optimizer to BUILT"
    torch.manual_seed(0)
    params = tuple(torch.randn(s, dtype=torch.float64) for s in ((6, 5), (5,), (3, 4), (2,)))
    _, state = _stepped(name, params)
    plain = tree.to_plain(state)
    owners = shards.owners([p.numel() for p in params], 3)
    parts = [(idx, shards.select(plain, idx)) for idx in
             (tuple(i for i, o in enumerate(owners) if o == r) for r in range(3))]
    joined = _rebuilt(shards.join(parts, len(params)), type(state))
    assert type(joined) is type(state)
    a, b = tree.tensors(joined), tree.tensors(state)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_state_without_declared_fields_is_refused():
    with pytest.raises(shards.UnshardableState, match="PER_PARAM"):
        shards.select({"_type": "MyState", "count": 0, "buf": []}, (0,))


def test_zero_on_one_rank_steps_as_the_wrapped_optimizer_bitwise():
    """World 1 (no collective runs: the rank owns everything): the commit, SAMA's diagonal
    and the gathered-state round trip are the wrapped optimizer's own."""
    torch.manual_seed(1)
    first = tuple(torch.randn(s) for s in ((4, 3), (3,)))
    params = [first, tuple(p.clone() for p in first)]
    plain_opt, wrapped = adam(0.01), Zero(adam(0.01), 0, 1)
    s0, s1 = plain_opt.init(params[0]), wrapped.init(params[1])
    assert isinstance(s1, ZeroState)
    with torch.no_grad():
        for _ in range(3):
            g = tuple(torch.randn_like(p) for p in params[0])
            s0 = plain_opt.commit(g, s0, params[0])
            s1 = wrapped.commit(tuple(x.clone() for x in g), s1, params[1])
    assert all(torch.equal(a, b) for a, b in zip(params[0], params[1]))
    assert all(torch.equal(a, b) for a, b in zip(tree.tensors(s0), tree.tensors(wrapped.local(s1, params[1]))))
    g = tuple(torch.randn_like(p) for p in params[0])
    assert all(torch.equal(torch.as_tensor(a).expand_as(b), b)
               for a, b in zip(plain_opt.diag(g, s0, params[0]), wrapped.diag(g, s1, params[1])))


@pytest.mark.parametrize("world,params,state,chosen", [
    (1, 10 * EASY, 20 * EASY, "ddp"),          # one process: nothing to shard
    (4, 10 * EASY, 10 * EASY, "ddp"),          # SGD with momentum: the state is no larger than the model
    (4, EASY // 8, EASY // 4, "ddp"),          # Adam on a small model: fits easily
    (4, EASY, 2 * EASY, "zero"),               # Adam on a large one: the state dominates
    (2, None, None, "ddp"),                    # sizes unknown
])
def test_auto_rule(world, params, state, chosen):
    got, why = decide("auto", world, params, state)
    assert got == chosen and why.startswith("auto: ")
    assert decide("zero", world, params, state) == ("zero", "as asked")


def test_the_plan_names_the_strategy_and_why(mloc_here):
    out = mloc_here("plan", REWEIGHTING).stdout
    assert "strategy under --nproc N > 1: ddp (auto: parameters, gradients and optimizer state (" in out
    asked = mloc_here("plan", REWEIGHTING, "--set", "train.strategy=zero").stdout
    assert "strategy under --nproc N > 1: zero (as asked; one process: ddp)" in asked
