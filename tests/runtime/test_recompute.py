"""Activation checkpointing of user modules (:mod:`mloc.runtime.base.recompute`): the same
numbers as without it (gradients, Hessian-vector products, and at substituted parameters,
where a plain checkpoint would recompute with the module's own), and fewer bytes kept for
the backward."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from mloc.runtime.base.recompute import recompute_children


def _block(a, b):
    return nn.Sequential(nn.Linear(a, b), nn.Tanh(), nn.Linear(b, b), nn.Tanh())


def _net():
    """Two blocks of Linear-Tanh-Linear-Tanh and a head: the children a checkpoint pays on."""
    torch.manual_seed(0)
    return nn.Sequential(_block(8, 64), _block(64, 64), nn.Linear(64, 3)).double()


X = torch.randn(32, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _loss(net, params=None):
    out = net(X) if params is None else functional_call(net, dict(zip([n for n, _ in net.named_parameters()], params)), (X,))
    return out.pow(2).mean()


def test_gradients_and_hessian_vector_products_are_unchanged():
    ref, net = _net(), _net()
    assert recompute_children(net) == ("0", "1", "2")
    assert recompute_children(net) == ()            # once
    assert list(net.state_dict()) == list(ref.state_dict())
    for mod in (ref, net):
        ps = list(mod.parameters())
        g = torch.autograd.grad(_loss(mod), ps, create_graph=True)
        v = [torch.ones_like(p) for p in ps]
        mod.hv = torch.autograd.grad(g, ps, v)
        mod.g = [t.detach() for t in g]
    # the same operations in the same order: equal to the last bit
    assert all(torch.equal(a, b) for a, b in zip(ref.g, net.g))
    assert all(torch.equal(a, b) for a, b in zip(ref.hv, net.hv))


def test_substituted_parameters_are_the_ones_recomputed():
    ref, net = _net(), _net()
    recompute_children(net)
    point = [(p.detach() + 0.25).requires_grad_() for p in ref.parameters()]
    want = torch.autograd.grad(_loss(ref, point), point)
    got = torch.autograd.grad(_loss(net, point), point)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    # and the module's own parameters give another gradient (the test can tell them apart)
    own = torch.autograd.grad(_loss(ref), list(ref.parameters()))
    assert not torch.allclose(own[0], want[0])


def _saved_bytes(net) -> int:
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss(net)
    return total[0]


def test_fewer_bytes_are_kept_for_the_backward():
    ref, net = _net(), _net()
    recompute_children(net)
    plain, kept = _saved_bytes(ref), _saved_bytes(net)
    # inside each block the two Tanh outputs (32×64 doubles each) are no longer kept;
    # checkpoint keeps in their place the block's input (kept without it too, by the first
    # Linear) and its parameters, of which the biases (2 × 64 doubles) are new. Measured:
    # 233728 bytes without, 141592 with.
    inner = 2 * (2 * 32 * 64 * 8 - 2 * 64 * 8)
    assert plain - kept >= inner, (plain, kept)
