"""Finite-difference BR-VJPs on real modules: BatchNorm statistics are left unchanged, the
passes run in fp32 under autocast, and the specialized two-level step equals the general
path bit for bit."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

from mloc.runtime import Edge, LowerOp, Problem, adam, finite_diff, first_order, sama, sgd
from tests.runtime.hand_built import hierarchy
from tests.runtime.paths import hypergrad_paths


def program(method, seed=0, optimizer=None):
    """A BatchNorm classifier (lower) whose per-example loss weights are the upper."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
    names = [n for n, _ in net.named_parameters()]
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    xv, yv = torch.randn(16, 6), torch.randint(0, 3, (16,))
    logits = torch.zeros(16, requires_grad=True)

    def run(theta, data):
        return functional_call(net, dict(zip(names, theta)), (data,))

    def inner(theta, w):
        losses = nn.functional.cross_entropy(run(theta, x), y, reduction="none")
        return (torch.sigmoid(w[0]) * losses).mean()

    lower = Problem("net", tuple(net.parameters()), inner, ("net", "weights"),
                    optimizer or sgd(0.1), buffers=tuple(net.buffers()))
    upper = Problem("weights", (logits,), lambda t: nn.functional.cross_entropy(run(t, xv), yv),
                    ("net",))
    return hierarchy([lower, upper], [Edge("weights", "net", method)]), net, logits


@pytest.mark.parametrize("method", [finite_diff(), sama()])
def test_batchnorm_statistics_unchanged(method):
    """A hypergradient step moves the statistics exactly as the upper's own forward (its
    validation loss) alone does: the finite-difference passes leave them untouched."""
    hier, net, _ = program(first_order())
    hier.problems["weights"].loss(hier.problems["net"].params)
    reference = [b.clone() for b in net.buffers()]

    hier, net, logits = program(method)
    lower = hier.problems["net"]
    before = [b.clone() for b in net.buffers()]
    lower.loss(lower.params, (logits,))  # control: a lower-loss forward moves the statistics
    assert not all(torch.equal(a, b) for a, b in zip(before, net.buffers()))
    with torch.no_grad():
        for b, saved in zip(net.buffers(), before):
            b.copy_(saved)

    hier.hypergrad("weights")
    assert logits.grad is not None and torch.count_nonzero(logits.grad) > 0
    assert all(torch.equal(a, b) for a, b in zip(reference, net.buffers()))


@pytest.mark.parametrize("method", [finite_diff(), sama()])
def test_fp32_under_autocast(method):
    """Inside a bf16 autocast region the finite-difference passes still run in fp32: the
    BR-VJP of a given adjoint is bit-identical to the one computed without autocast."""
    hier, net, logits = program(method)
    net.eval()
    lower = hier.problems["net"]
    op = LowerOp(lower, [lower.params, (logits,)], lower.buffers)
    v = tuple(torch.randn_like(p) for p in lower.params)

    def brvjp():
        outputs, cotangents = method.vjp(op, v)
        return torch.autograd.grad(outputs, logits, cotangents)[0]
    plain = brvjp()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = brvjp()
        control = net(torch.randn(4, 6))
    assert control.dtype == torch.bfloat16  # autocast really is on in that region
    assert torch.equal(mixed, plain)


@pytest.mark.parametrize("method", [finite_diff(), sama()])
def test_zero_adjoint_gives_zero_not_nan(method):
    hier, _, logits = program(method)
    lower = hier.problems["net"]
    op = LowerOp(lower, [lower.params, (logits,)], lower.buffers)
    outputs, cotangents = method.vjp(op, tuple(torch.zeros_like(p) for p in lower.params))
    (g,) = torch.autograd.grad(outputs, logits, cotangents)
    assert torch.count_nonzero(g) == 0


def general(hier, name):
    """The same hypergradient through the unspecialized two-level path (``_single``)."""
    hier._single(hier.plan(name))


@pytest.mark.parametrize("method", [finite_diff(), finite_diff(1e-3), sama()])
@pytest.mark.parametrize("optimizer", [sgd(0.1, momentum=0.9, nesterov=True), adam(1e-2)])
def test_bound_step_equals_general_path(method, optimizer):
    """The step that ``plan`` specializes for finite differences writes the same ``.grad``
    bits as the general straight-line path and as path enumeration, over several training
    steps of the lower (its optimizer state, hence SAMA's diagonal, changes), in and out of
    a bf16 autocast region, with BatchNorm buffers to guard."""
    hier, net, logits = program(method, optimizer=optimizer)
    assert hier.plan("weights").shape == "bound"
    lower = hier.problems["net"]
    for step in range(3):
        for region in (torch.autocast("cpu", dtype=torch.bfloat16, enabled=False),
                       torch.autocast("cpu", dtype=torch.bfloat16)):
            results = []
            for run in (hier.hypergrad, lambda name: general(hier, name)):
                logits.grad = None
                with region:  # the seed (the upper's loss) does run under autocast
                    run("weights")
                results.append(logits.grad)
            with region:
                results.append(hypergrad_paths(hier, "weights")[0])
            assert torch.count_nonzero(results[0]) > 0
            assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
        net.zero_grad()
        lower.loss(lower.params, (logits,)).backward(inputs=lower.params)
        lower.step()


@pytest.mark.parametrize("method", [finite_diff(), sama()])
def test_bound_step_partial_seed_and_argument_order(method):
    """The upper's loss reads only part of the lower (a ``None`` seed becomes zeros), and the
    lower's loss takes the upper before itself (``θ`` is not its first argument)."""
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True) for _ in "ab")
    lam = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    loss = lambda l, w: ((w[0] - l[0]) ** 2).sum() + (w[1] * l[0].sin()).sum() ** 2  # noqa: E731
    lower = Problem("w", (a, b), loss, ("lam", "w"), adam(0.1))
    upper = Problem("lam", (lam,), lambda w: (w[0] ** 3).sum(), ("w",))
    hier = hierarchy([lower, upper], [Edge("lam", "w", method)])
    assert hier.plan("lam").shape == "bound"
    hier.hypergrad("lam")
    bound, lam.grad = lam.grad, None
    general(hier, "lam")
    assert torch.count_nonzero(bound) > 0 and torch.equal(bound, lam.grad)
