"""`mloc run` on Meta-Weight-Net equals a hand-written PyTorch loop.

The programs in tests/equivalence/ are the example's Meta-Weight-Net with plain optimizers
(SGD lr 0.1 below, Adam lr 1e-3 above, fp32) and `finite_diff(eps=0.01)`,
`neumann(iters=3, alpha=0.1)`, `cg(iters=3)` or `sama(eps=0.01)`. Each runs 20 outer steps through the real `mloc run` path
(compile, write train.py, train, checkpoint) in this process; every parameter of both
problems must match tests/reference/mwn_hand.py (no mloc import) to a relative error of
1e-6 (per tensor, ‖mloc − hand‖ / ‖hand‖).

mloc's optimizer commits are written operation for operation like torch.optim (and the
hand loop), so `neumann` agrees bit for bit. `finite_diff` still differs by rounding: its
two perturbed losses go through one backward with cotangents (−c, c), where the hand loop
takes two gradients, and the central difference amplifies the last bits by ~1/ε. The
float64 test rules out anything but rounding: there the two agree to ~1e-15.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import torch

from mloc.cli import main  # noqa: E402
from mloc.codegen.compile import compile_program, load_generated  # noqa: E402
from mloc.runtime.program.checkpoint import load_checkpoint  # noqa: E402
from mloc.runtime.program.engine import RunConfig  # noqa: E402
from mloc.runtime.processes.launch import build  # noqa: E402

HERE = Path(__file__).resolve().parent
EQUIVALENCE = HERE / "equivalence"
sys.path.insert(0, str(HERE / "reference"))
import mwn_hand  # noqa: E402

STEPS = 20
PROGRAMS = {"finite_diff": (EQUIVALENCE / "mwn_finite_diff.mlo", dict(eps=0.01)),
            "neumann": (EQUIVALENCE / "mwn_neumann.mlo", dict(iters=3, alpha=0.1)),
            "cg": (EQUIVALENCE / "mwn_cg.mlo", dict(iters=3)),
            "sama": (EQUIVALENCE / "mwn_sama.mlo", dict(eps=0.01))}


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def relative_errors(ours: dict, ref: dict) -> dict[str, float]:
    """``‖ours − ref‖ / ‖ref‖`` for every parameter tensor of both problems."""
    out = {}
    for problem, params in ref.items():
        for name, t in params.items():
            a = ours[problem][name].detach().to(t.dtype)
            assert a.shape == t.shape, f"{problem}.{name}: shape {tuple(a.shape)} != {tuple(t.shape)}"
            out[f"{problem}.{name}"] = float((a - t).norm() / t.norm().clamp_min(1e-30))
    return out


@pytest.mark.parametrize("method", sorted(PROGRAMS))
def test_mloc_run_matches_hand_written_loop(method, tmp_path, one_thread):
    path, kwargs = PROGRAMS[method]
    rc = main(["run", str(path), "--steps", str(STEPS), "--out", str(tmp_path), "--quiet",
               "--precision", "fp32", "--device", "cpu"])
    assert rc == 0
    state = load_checkpoint(tmp_path / "checkpoint.pt", None)
    assert state["step"] == STEPS
    ours = {name: p["module"] for name, p in state["problems"].items()}
    ref = mwn_hand.run(method, STEPS, seed=0, threads=1, **kwargs)
    assert set(ours) == set(ref)
    errors = relative_errors(ours, ref)
    assert len(errors) == 8  # 4 tensors per problem
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-6, f"{method}: {worst} differs by {errors[worst]:.2e} ({errors})"
    # and the parameters did move (a loop that never steps would agree trivially)
    fresh = mwn_hand.MWNLoop(method, **kwargs).parameters()
    for problem, params in ref.items():
        for name, t in params.items():
            assert not torch.equal(t, fresh[problem][name]), f"{problem}.{name} never moved"


@pytest.mark.parametrize("method", sorted(PROGRAMS))
def test_same_loop_in_float64(method, tmp_path, one_thread):
    """The compiled program built in float64 agrees with the hand loop to rounding of fp64."""
    path, kwargs = PROGRAMS[method]
    compiled = compile_program(str(path), out_dir=tmp_path)
    assert compiled.ok, compiled.diagnostics
    declaration = load_generated(compiled.source, str(tmp_path / "train.py"))
    program = build(declaration, RunConfig(steps=STEPS, seed=0, device="cpu", precision="fp32", dtype="float64"))
    loop = mwn_hand.MWNLoop(method, dtype=torch.float64, **kwargs)
    for _ in range(STEPS):
        program.outer_step()
        loop.outer_step()
    ours = {name: dict(lv.module.named_parameters()) for name, lv in program.live.items()}
    errors = relative_errors(ours, loop.parameters())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-12, f"{method}: {worst} differs by {errors[worst]:.2e}"


def test_hand_loop_optimizers_are_torch_optim(one_thread):
    """The written-out SGD and Adam of the reference are torch.optim's, bit for bit."""
    for method, (_, kwargs) in PROGRAMS.items():
        a = mwn_hand.run(method, 5, seed=0, threads=1, optimizers="manual", **kwargs)
        b = mwn_hand.run(method, 5, seed=0, threads=1, optimizers="torch", **kwargs)
        for problem in a:
            for name in a[problem]:
                assert torch.equal(a[problem][name], b[problem][name]), (method, problem, name)
