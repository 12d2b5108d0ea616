"""BoundLoss: the user's loss over modules, evaluated at substituted parameters.

The reference is `torch.func.functional_call` (what the substitution specializes): same
values and same gradients, bit for bit, on modules with nesting, tied weights, a shared
submodule, buffers, and losses that read parameters by attribute or through
`.parameters()`; the modules' own parameters are back after every call, also when the
loss raises.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mloc.runtime.program.binding import BoundLoss, select_parameters

F64 = torch.float64


class Tied(nn.Module):
    """An encoder/decoder with a tied weight, a shared block used twice, and a buffer."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 3)
        self.dec = nn.Linear(3, 4)
        self.dec.weight = nn.Parameter(self.enc.weight.detach().t().contiguous())
        self.block = nn.Linear(4, 4)
        self.pair = nn.ModuleList([self.block, self.block])
        self.register_buffer("scale", torch.tensor(1.5, dtype=F64))

    def forward(self, x):
        h = torch.tanh(self.enc(x))
        y = self.dec(h)
        for b in self.pair:
            y = b(y)
        return y * self.scale


class TrulyTied(nn.Module):
    """One parameter under two names (`b.weight is a.weight`)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def loss_fn(model, other, batch):
    # attribute access and .parameters() inside user code must see the substitution
    x = batch
    reg = sum((p ** 2).sum() for p in model.parameters())
    return (model(x) ** 2).mean() + 0.1 * reg + (other.weight * model.enc.weight.sum()).sum() + other.bias.sum()


def _make(module_cls=Tied):
    torch.manual_seed(0)
    model, other = module_cls().to(F64), nn.Linear(2, 2).to(F64)
    return model, other


def _reference(fn, modules, slots, values, batch):
    """`functional_call` on copies of the modules (with a submodule shared under several
    names, torch 2.13's `functional_call` leaves a substituted tensor behind)."""
    container = nn.Module()
    container.mods = nn.ModuleList(copy.deepcopy(list(modules)))

    def forward(*extra):
        return fn(*container.mods, *extra)
    container.forward = forward
    mapping = {f"mods.{i}.{s}": v for i, (ss, vs) in enumerate(zip(slots, values)) for s, v in zip(ss, vs)}
    return torch.func.functional_call(container, mapping, (batch,), strict=False)


def _bound_pair():
    """`loss_fn` over (Tied, Linear), bound: (bound, model, other, slots, own, batch)."""
    model, other = _make()
    batch = torch.randn(5, 4, dtype=F64)
    slots = [select_parameters(model, ("*",), ()), select_parameters(other, ("*",), ())]
    own = [tuple(dict(model.named_parameters())[s] for s in slots[0]),
           tuple(dict(other.named_parameters())[s] for s in slots[1])]
    return BoundLoss(loss_fn, [model, other], slots, own, lambda: (batch,)), model, other, slots, own, batch


def test_substituted_call_equals_functional_call_in_value_and_gradient():
    bound, model, other, slots, own, batch = _bound_pair()
    assert bound._slots is not None                     # the specialized path is the one tested
    point = [tuple((p.detach() + 0.01 * torch.randn_like(p)).requires_grad_() for p in ps) for ps in own]
    got = bound(*point)
    want = _reference(loss_fn, [model, other], slots, point, batch)
    assert torch.equal(got, want)
    flat = [t for ps in point for t in ps]
    g_got = torch.autograd.grad(got, flat)
    g_want = torch.autograd.grad(want, flat)
    assert all(torch.equal(a, b) for a, b in zip(g_got, g_want))
    # the own parameters are back, and the own-parameter call is the plain call
    assert all(a is b for a, b in zip(model.parameters(), own[0]))
    assert torch.equal(bound(*own), loss_fn(model, other, batch)) and torch.equal(bound.own(), bound(*own))


def test_a_tied_parameter_is_replaced_under_every_name():
    torch.manual_seed(1)
    model = TrulyTied().to(F64)
    slots = [select_parameters(model, ("*",), ())]
    assert slots == [["a.weight"]]                      # named_parameters lists it once
    own = [(model.a.weight,)]
    x = torch.randn(2, 3, dtype=F64)
    bound = BoundLoss(lambda m, b: m(b).sum(), [model], slots, own, lambda: (x,))
    w = torch.randn(3, 3, dtype=F64)
    assert torch.allclose(bound((w,)), (x @ w.t() @ w.t()).sum(), rtol=0, atol=1e-12)
    assert model.b.weight is model.a.weight is own[0][0]


def test_parameters_are_restored_when_the_loss_raises():
    model, other = _make()
    slots = [select_parameters(model, ("*",), ())]
    own = [tuple(model.parameters())]

    def bad(m, batch):
        m(batch)
        raise RuntimeError("user error")
    bound = BoundLoss(bad, [model], slots, own, lambda: (torch.randn(2, 4, dtype=F64),))
    with pytest.raises(RuntimeError, match="user error"):
        bound(tuple(torch.zeros_like(p) for p in own[0]))
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    assert all(a is b for a, b in zip(model.parameters(), own[0]))


def test_offsets_evaluate_at_base_plus_delta():
    """A problem with `init = U`: its loss at θ_U + δ."""
    model, _ = _make()
    slots = [select_parameters(model, ("*",), ())]
    base = tuple(model.parameters())
    delta = tuple(torch.full_like(p, 0.1) for p in base)
    x = torch.randn(3, 4, dtype=F64)
    fn = lambda m, b: (m(b) ** 2).sum()  # noqa: E731
    bound = BoundLoss(fn, [model], slots, [delta, base], lambda: (x,), offsets={0: 1}, module_count=1)
    want = _reference(fn, [model], slots, [tuple(b + d for b, d in zip(base, delta))], x)
    assert torch.equal(bound(delta, base), want)
    assert torch.equal(bound.own(), want)


def test_parametrized_modules_go_through_functional_call():
    torch.manual_seed(2)
    lin = nn.Linear(3, 3).to(F64)
    torch.nn.utils.parametrize.register_parametrization(lin, "weight", _Symmetric())
    slots = [select_parameters(lin, ("*",), ())]
    params = dict(lin.named_parameters())
    own = [tuple(params[s] for s in slots[0])]
    x = torch.randn(2, 3, dtype=F64)
    fn = lambda m, b: m(b).sum()  # noqa: E731
    bound = BoundLoss(fn, [lin], slots, own, lambda: (x,))
    assert bound._slots is None
    point = [tuple(torch.randn_like(p) for p in own[0])]
    assert torch.equal(bound(*point), _reference(fn, [lin], slots, point, x))


class _Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).t()


def test_other_modules_as_constants_give_the_same_gradient_and_record_no_graph_for_them():
    """`own_with_constants(i)` (a plain training step of read i): the same loss value and the
    same gradient for read i's parameters, bit for bit, while the other module's layers are
    not recorded by autograd (its parameters get no gradient, and no graph node reaches
    them); the aliases follow in-place updates of the other module's parameters."""
    bound, model, other, slots, own, batch = _bound_pair()
    fast = bound.own_with_constants(0)
    assert fast is not None
    for _ in range(2):
        a, b = fast(), bound.own()
        assert torch.equal(a, b)
        ga = torch.autograd.grad(a, own[0])
        gb = torch.autograd.grad(b, own[0])
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
        assert torch.autograd.grad(a, own[1], allow_unused=True) == (None, None)
        assert all(x is y for x, y in zip(other.parameters(), own[1]))      # put back
        with torch.no_grad():                                               # an optimizer step
            for p in own[1]:
                p.add_(1.0)
    assert bound.own_with_constants(1) is not None
    lonely = BoundLoss(lambda m, b: m(b).sum(), [model], [slots[0]], [own[0]], lambda: (batch,))
    assert lonely.own_with_constants(0) is None                             # nothing to bind
