"""Module buffers change only in their own problem's training steps; evaluations, `losses()`
and `hypergradients()` run in evaluation mode (or, for hypergradients, leave buffers alone)
and restore every module's mode (docs/runtime.md, "Module buffers and modes").

The program (tests/buffers/bn.mlo) has BatchNorm in both problems: the lower problem `net`
(run by the upper's loss too) and the upper problem `weights` (run by the lower's loss and,
once, by its own). `num_batches_tracked` counts the training-mode forwards that updated a
BatchNorm layer, so after S outer steps with unroll U the rule says exactly: `net` S·U
(its own lower steps, including the ones that commit `itd`'s unrolled steps), `weights` S
(the first forward of its own loss in each of its steps), whatever the method does inside
a hypergradient.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mloc
from mloc.builtins import METHODS
from mloc.runtime.program.checkpoint import load_checkpoint

BN = Path(__file__).parent / "buffers" / "bn.mlo"
STEPS, UNROLL = 4, 3
EXECUTABLE = sorted(n for n, d in METHODS.items() if not d.caps.planned)


def _run(mloc_here, out: Path, *sets: str):
    argv = ["run", str(BN), "--out", str(out), "--quiet", "--threads", "1"]
    for s in sets:
        argv += ["--set", s]
    return mloc_here(*argv)


def _tracked(run_dir: Path) -> dict[str, int]:
    state = load_checkpoint(run_dir / "checkpoint.pt", None)
    return {f"{n}.{k}": int(t) for n, p in state["problems"].items()
            for k, t in p["module"].items() if k.endswith("num_batches_tracked")}


@pytest.mark.parametrize("method", EXECUTABLE)
def test_only_a_problems_own_steps_update_its_buffers(method, tmp_path, mloc_here):
    proc = _run(mloc_here, tmp_path, f"weights->net.hypergrad={method}")
    assert proc.returncode == 0, proc.stderr
    assert _tracked(tmp_path) == {"net.net.1.num_batches_tracked": STEPS * UNROLL,
                                  "weights.norm.num_batches_tracked": STEPS}


def test_losses_evaluations_and_hypergradients_leave_buffers_and_modes_alone():
    s = mloc.load(BN, device="cpu")
    s.step()
    modules = [s.module("net"), s.module("weights")]
    s.module("weights").net[0].eval()                 # a mixed mode, to be restored as it was
    before = {k: v.clone() for m in modules for k, v in m.state_dict().items()}
    modes = [sub.training for m in modules for sub in m.modules()]
    evaluations = s.evaluate()
    s.losses()
    s.hypergradients()
    assert evaluations["training_flags"] == 0.0   # evaluated in eval mode (named after its function)
    after = {k: v for m in modules for k, v in m.state_dict().items()}
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [sub.training for m in modules for sub in m.modules()] == modes


def test_run_and_api_evaluate_alike(tmp_path, mloc_here):
    """`mloc run`'s evaluation at the last step equals the API's `evaluate()` there."""
    proc = _run(mloc_here, tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ran = {r["eval"]: r["value"] for r in records if r.get("step") == STEPS and "eval" in r}
    s = mloc.load(BN, device="cpu")
    s.run(STEPS)
    assert s.evaluate() == ran
