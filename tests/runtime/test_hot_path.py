"""Guards for the hot path: no host synchronisation, and the one-backward contract."""

import ast
from pathlib import Path

import torch

import pytest

from mloc.runtime import Edge, Problem, cg, finite_diff, itd, neumann, sama, sgd
from tests.runtime.hand_built import hierarchy

RUNTIME = Path(__file__).resolve().parents[2] / "mloc" / "runtime"
SYNCING = {"item", "tolist", "cpu", "numpy"}
# Modules that run only at log, checkpoint or compile boundaries, where one read is the point.
BOUNDARY = {"metrics.py", "finite.py", "checkpoint.py", "selection.py"}   # selection: after evaluations
# Reads allowed by name: a scheduled rate handed to a torch.optim optimizer, which takes host
# floats (one read per step of such a problem, free on the CPU; the engine keeps the rate in
# a device tensor).
ALLOWED = {("torch_optim.py", "_host_lr"),
           ("pipeline_stage.py", "recv"),   # the shape header of a message between pipeline workers (CPU, gloo)
           # Shampoo's rejected-root counts: read at log boundaries (Optimizer.report) and
           # when a refresh was rejected (the warning), never on a healthy step
           ("rootwork.py", "failure_counts"),
           # strategy zero: the whole optimizer state gathered to the host (all_gather_object)
           # for a checkpoint, and by itd's unroll once per hypergradient step (docs/runtime.md,
           # "Strategies": the one place zero pays a host round trip per step)
           ("zero.py", "gathered")}


def test_runtime_never_reads_tensors_back_to_the_host():
    """`.item()` and friends block on the device every step (Betty calls one per step)."""
    found = []
    for path in RUNTIME.rglob("*.py"):
        if path.name in BOUNDARY:
            continue
        tree = ast.parse(path.read_text())
        allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                   and (path.name, f.name) in ALLOWED for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in SYNCING and id(node) not in allowed:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found


def test_hypergrad_accumulates_like_backward():
    """`.grad` is accumulated into (as `backward` does), never overwritten."""
    w, lam = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    lower = Problem("w", (w,), lambda w, l: ((w[0] - l[0]) ** 2).sum(), ("w", "lam"), sgd(0.1))
    upper = Problem("lam", (lam,), lambda w: (w[0] ** 2).sum(), ("w",))
    for method in (finite_diff(), cg(3)):
        hier = hierarchy([lower, upper], [Edge("lam", "w", method)])
        lam.grad = None
        hier.hypergrad("lam")
        once = lam.grad.clone()
        hier.hypergrad("lam")
        assert torch.allclose(lam.grad, 2 * once)
        assert w.grad is None  # nothing leaks into the lower's .grad


def _three_level(method_low, method_mid):
    """u -> m -> w (u reads m and w: the general path with feedback), float64."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    m = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    low = Problem("w", (w,), lambda w, m: ((w[0] - m[0]) ** 2).sum() + (w[0] ** 4).sum() / 10,
                  ("w", "m"), sgd(0.1))
    mid = Problem("m", (m,), lambda m, u, w: ((m[0] - u[0]) ** 2).sum() + (w[0] * m[0]).sum(),
                  ("m", "u", "w"), sgd(0.1))
    top = Problem("u", (u,), lambda m, w: (m[0] * w[0]).sum() + (m[0] ** 2).sum(), ("m", "w"))
    return [low, mid, top], [Edge("m", "w", method_low), Edge("u", "m", method_mid)], u


def _two_level(method):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    lam = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    unused = torch.zeros(2, dtype=torch.float64, requires_grad=True)   # no path to the loss
    lower = Problem("w", (w,), lambda w, l: ((w[0] - l[0]) ** 2).sum() + (w[0] ** 4).sum(), ("w", "lam"),
                    sgd(0.1))
    upper = Problem("lam", (lam, unused), lambda w: ((w[0] - 1) ** 2).sum(), ("w",))
    return [lower, upper], [Edge("lam", "w", method)], lam


@pytest.mark.parametrize("case", ["finite_diff", "sama", "cg", "neumann", "itd", "three_level"])
def test_returned_hypergradient_equals_the_accumulated_one(case):
    """`hypergrad(name, accumulate=False)` (what the training loop takes) returns exactly
    what `hypergrad(name)` accumulates into `.grad`, on every shape of step (the bound
    finite-difference step, a single BR-VJP, the fused unrolled sweep, the general
    composer), writes no `.grad`, and marks a parameter with no path as None."""
    if case == "three_level":
        problems, edges, _ = _three_level(cg(4), neumann(3))
        top = "u"
    else:
        method = {"finite_diff": finite_diff(), "sama": sama(), "cg": cg(3), "neumann": neumann(3),
                  "itd": itd(3)}[case]
        problems, edges, _ = _two_level(method)
        top = "lam"
    hier = hierarchy(problems, edges)
    params = next(p for p in problems if p.name == top).params
    for p in params:
        p.grad = None
    returned = hier.hypergrad(top, accumulate=False)
    assert all(p.grad is None for p in params)
    hier.hypergrad(top)
    for p, r in zip(params, returned):
        if p.grad is None:
            assert r is None
        else:
            assert torch.equal(p.grad, r)
    if case != "three_level":
        assert returned[1] is None and params[1].grad is None
    assert hier._plans[top].shape == {"finite_diff": "bound", "sama": "bound", "cg": "single",
                                      "neumann": "single", "itd": "fused", "three_level": "general"}[case]
