"""Parameters a loss never uses (a BatchNorm defined but not called, an unused head) train
as a hand-written loop trains them: a zero gradient from every hypergradient method, and
the optimizer leaves them untouched (`torch.optim` skips a parameter whose `.grad` is None:
no weight decay, no momentum). The trace says so at compile time (W108) and names the
`frozen` globs that declare them.

The reference is the same program with those parameters declared `frozen` (then mloc never
hands them to an optimizer): every tensor of every module, the unused ones and the rest,
must end bit-identical (tests/unused/unused.mlo: SGD with momentum and weight decay below,
Adam with weight decay above, so a zero gradient committed would move them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mloc.builtins import METHODS
from mloc.cli import main
from mloc.runtime.program.checkpoint import load_checkpoint

UNUSED = Path(__file__).parent / "unused" / "unused.mlo"
EXECUTABLE = sorted(n for n, d in METHODS.items() if not d.caps.planned)
# Two full runs per method: the default tier runs one method that solves (cg: its gradient
# call raised before) and one that perturbs (finite_diff: it moved the unused parameters
# before); the slow tier runs every method of the registry.
DEFAULT_TIER = ("cg", "finite_diff")
TIERED = [m if m in DEFAULT_TIER else pytest.param(m, marks=pytest.mark.slow) for m in EXECUTABLE]
FROZEN = ('net.frozen=["norm.*", "aux.*"]', 'weights.frozen=["spare.*"]')


def _run(capsys, out: Path, *sets: str) -> tuple[int, str]:
    """`mloc run` in this process (its start-up, not its subject, is what a subprocess would
    add); returns the exit status and what it wrote to stderr."""
    argv = ["run", str(UNUSED), "--out", str(out), "--quiet", "--threads", "1"]
    for s in sets:
        argv += ["--set", s]
    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err


def _modules(run_dir: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(run_dir / "checkpoint.pt", None)
    return {f"{n}.{k}": t for n, p in state["problems"].items() for k, t in p["module"].items()}


@pytest.mark.parametrize("method", TIERED)
def test_unused_parameters_train_as_if_frozen(method, tmp_path, capsys):
    edge = f"weights->net.hypergrad={method}"
    (plain, plain_err), (frozen, frozen_err) = _run(capsys, tmp_path / "plain", edge), \
        _run(capsys, tmp_path / "frozen", edge, *FROZEN)
    assert plain == 0, plain_err
    assert frozen == 0, frozen_err
    got, want = _modules(tmp_path / "plain"), _modules(tmp_path / "frozen")
    assert set(got) == set(want) and "net.aux.weight" in got and "weights.spare.bias" in got
    moved = [k for k in want if not torch.equal(got[k], want[k])]
    assert moved == [], f"differ from the frozen run: {moved}"
    # the trace warned, with the globs that say it; declared frozen, it is quiet
    assert "warning[W108]: 4 parameters of `net`" in plain_err
    assert 'frozen = ["norm.*", "aux.*"]' in plain_err and 'frozen = ["spare.*"]' in plain_err
    assert "W108" not in frozen_err


def _hypergrad(capsys, *sets: str) -> dict:
    argv = ["hypergrad", str(UNUSED), "--json", "--dtype", "float64"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", EXECUTABLE)
def test_unused_parameters_get_a_zero_hypergradient(method, capsys):
    edge = f"weights->net.hypergrad={method}"
    got, want = _hypergrad(capsys, edge)["weights"], _hypergrad(capsys, edge, *FROZEN)["weights"]
    assert set(got) == set(want) | {"spare.weight", "spare.bias"}
    assert all(torch.equal(torch.tensor(got[k]), torch.zeros(torch.tensor(got[k]).shape, dtype=torch.float64))
               for k in ("spare.weight", "spare.bias"))
    for k in want:
        assert torch.equal(torch.tensor(got[k]), torch.tensor(want[k])), k
