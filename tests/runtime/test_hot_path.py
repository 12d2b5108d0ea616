"""Guards for the hot path: no host synchronisation, and the one-backward contract."""

import ast
from pathlib import Path

import torch

from mloc.runtime import Edge, Hierarchy, Problem, cg, finite_diff, sgd

RUNTIME = Path(__file__).resolve().parents[2] / "mloc" / "runtime"
SYNCING = {"item", "tolist", "cpu", "numpy"}
# Modules that run only at log, checkpoint or compile boundaries, where one read is the point.
BOUNDARY = {"metrics.py", "checkpoint.py"}


def test_runtime_never_reads_tensors_back_to_the_host():
    """`.item()` and friends block on the device every step (Betty calls one per step)."""
    found = []
    for path in RUNTIME.rglob("*.py"):
        if path.name in BOUNDARY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SYNCING:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found


def test_hypergrad_accumulates_like_backward():
    """`.grad` is accumulated into (as `backward` does), never overwritten."""
    w, lam = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    lower = Problem("w", (w,), lambda w, l: ((w[0] - l[0]) ** 2).sum(), ("w", "lam"), sgd(0.1))
    upper = Problem("lam", (lam,), lambda w: (w[0] ** 2).sum(), ("w",))
    for method in (finite_diff(), cg(3)):
        hier = Hierarchy([lower, upper], [Edge("lam", "w", method)])
        lam.grad = None
        hier.hypergrad("lam")
        once = lam.grad.clone()
        hier.hypergrad("lam")
        assert torch.allclose(lam.grad, 2 * once)
        assert w.grad is None  # nothing leaks into the lower's .grad
