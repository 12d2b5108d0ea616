"""`--strategy zero` (ZeRO-1: each rank keeps and updates its shard of the optimizer state)
equals `--strategy ddp` at `--nproc 2`, two gloo processes, for every optimizer in the
registry and every hypergradient method (slow tier); registry-parametrised as
tests/runtime_loop/test_overlap_nproc.py, so an optimizer or method added to the registry
needs its case here (the first test fails until it has one).

The tolerance is 1e-5 relative (float32), and the comparison is bitwise where the sharded
commit computes what the replicated one does, element for element: every optimizer here
steps each tensor (or each block of it) on its own, and a parameter's value reaches the
other rank by a broadcast of the owner's, so every case is asserted bitwise."""

from __future__ import annotations

import pytest
import torch

from mloc.builtins import METHODS, OPTIMIZERS
from tests.run.helpers import SMALL, mloc, params

OPTIMIZER_CASES = {
    "sgd": "sgd(lr=0.1, momentum=0.9)",
    "adam": "adam(lr=0.01)",
    "adamw": "adamw(lr=0.01, weight_decay=0.01)",
    "shampoo": "shampoo(lr=0.01, update_every=2, block_size=4)",
    "torch": "torch.optim.RAdam(lr=0.01)",
}
METHOD_ARGS = {"cg": "cg(iters=3)", "itd": "itd(steps=2)", "neumann": "neumann(iters=3, alpha=0.1)"}
METHOD_CASES = sorted(m for m, d in METHODS.items() if d.runtime is not None)


def test_every_registry_optimizer_has_a_case():
    assert set(OPTIMIZER_CASES) == set(OPTIMIZERS), "add the new optimizer to OPTIMIZER_CASES"


def _run(tmp_path, strategy: str, sets: list[str], steps: int = 6):
    out = tmp_path / strategy
    proc = mloc("run", SMALL, "--steps", steps, "--out", out, "--quiet", "--nproc", "2", "--compile", "off",
                "--strategy", strategy, *sets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _same(tmp_path, sets: list[str]) -> None:
    ddp, zero = (params(_run(tmp_path, s, sets)) for s in ("ddp", "zero"))
    assert ddp.keys() == zero.keys()
    for k in ddp:
        err = float((zero[k] - ddp[k]).abs().max() / ddp[k].abs().max().clamp_min(1e-12))
        assert err <= 1e-5, (k, err)
        assert torch.equal(zero[k], ddp[k]), (k, err)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPTIMIZER_CASES))
def test_zero_equals_ddp_for_each_lower_optimizer(tmp_path, name):
    """The lower's (and, for the first-order case, the upper's) optimizer sharded."""
    method = "neumann(iters=3, alpha=0.1)" if OPTIMIZERS[name].caps.differentiable else "first_order"
    _same(tmp_path, ["--set", f"net.optimizer={OPTIMIZER_CASES[name]}", "--set", f"weights->net.hypergrad={method}",
                     "--set", f"weights.optimizer={OPTIMIZER_CASES[name]}"])


@pytest.mark.slow
@pytest.mark.parametrize("method", METHOD_CASES + ["sama/adam"])
def test_zero_equals_ddp_for_each_method(tmp_path, method):
    """Every hypergradient method, its upper's steps committed through the sharded optimizer
    too; sama over Adam reads the lower's sharded state for its diagonal, itd for its unroll."""
    name, _, lower = method.partition("/")
    sets = ["--set", f"weights->net.hypergrad={METHOD_ARGS.get(name, name)}"]
    _same(tmp_path, sets + (["--set", f"net.optimizer={OPTIMIZER_CASES[lower]}"] if lower else []))
