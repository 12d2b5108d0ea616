"""Every built-in the checker accepts runs, read from the descriptor registry itself.

- every optimizer with a runtime trains the lower problem of a tiny bilevel program;
- every (method, lower optimizer) pair the descriptors allow trains one outer step, and
  every pair they forbid is a located diagnostic, never an internal error;
- every built-in without a runtime is E704 at check time (so no program the checker
  accepts reaches `mloc run` with it).

Adding a built-in adds its cases here without editing this file.
"""

from __future__ import annotations

import math

import pytest

import mloc
from mloc.builtins import METHODS, OPTIMIZERS
from mloc.passes.pipeline import compile_file
from tests.conftest import ROOT

SMALL = ROOT / "tests" / "run" / "small.mlo"
EDGE = "weights->net"


def _call(descriptor, **given) -> str:
    """A call of the built-in with its required arguments filled in (lr for optimizers)."""
    args = dict(given)
    for p in descriptor.signature.params:
        if p.name not in args and repr(p.default) == "REQUIRED":
            args[p.name] = 0.05 if p.name == "lr" else 1
    inner = ", ".join(f"{k}={v}" for k, v in args.items())
    return f"{descriptor.name}({inner})"


RUNNABLE = sorted(n for n, d in OPTIMIZERS.items() if d.runtime is not None)
PENDING = sorted([("optimizer", n) for n, d in OPTIMIZERS.items() if not d.executable]
                 + [("method", n) for n, d in METHODS.items() if not d.executable])
PAIRS = [(m, o) for m in sorted(METHODS) if METHODS[m].runtime is not None for o in RUNNABLE]


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_optimizer_takes_a_plain_step(name):
    session = mloc.load(SMALL, set=[f"net.optimizer={_call(OPTIMIZERS[name], lr=0.05)}",
                                    f"weights.optimizer={_call(OPTIMIZERS[name], lr=0.01)}",
                                    f"{EDGE}.hypergrad=first_order"], device="cpu")
    before = {k: v.detach().clone() for k, v in session.module("net").state_dict().items()}
    session.run(2)
    after = session.module("net").state_dict()
    assert any(not (before[k] == after[k]).all() for k in before)       # it trained
    assert all(math.isfinite(v) for v in session.losses().values())


@pytest.mark.parametrize("method,opt", PAIRS)
def test_every_allowed_method_and_lower_optimizer_pair_runs_one_outer_step(method, opt):
    needs = METHODS[method].caps.needs
    allowed = needs <= OPTIMIZERS[opt].caps.provides
    overrides = [f"net.optimizer={_call(OPTIMIZERS[opt], lr=0.05)}", f"{EDGE}.hypergrad={method}"]
    if not allowed:
        with pytest.raises(mloc.api.ProgramError) as err:
            mloc.load(SMALL, set=overrides, device="cpu")
        assert {d.code for d in err.value.diagnostics} == {"E401"}
        return
    session = mloc.load(SMALL, set=overrides, device="cpu")
    before = [p.detach().clone() for p in session.module("weights").parameters()]
    session.step()
    assert session.steps_done == 1
    after = list(session.module("weights").parameters())
    moved = any(not (a == b).all() for a, b in zip(before, after))
    assert moved or method == "first_order"    # first_order drops the only path to `weights`
    assert all(math.isfinite(v) for v in session.losses().values())


@pytest.mark.parametrize("kind,name", PENDING)
def test_a_built_in_without_a_runtime_is_E704_at_check(tmp_path, kind, name):
    text = SMALL.read_text()
    if kind == "optimizer":
        text = text.replace("optimizer = sgd(lr=0.1, momentum=0.9)", f"optimizer = {_call(OPTIMIZERS[name], lr=0.1)}")
    else:
        text = text.replace("hypergrad = neumann(iters=3, alpha=0.1)", f"hypergrad = {_call(METHODS[name])}")
    path = tmp_path / "small.mlo"
    path.write_text(text)
    (tmp_path / "small.py").write_text((SMALL.parent / "small.py").read_text())
    unit = compile_file(str(path))
    e704 = [d for d in unit.diagnostics if d.code == "E704"]
    assert e704 and name in e704[0].message
    assert e704[0].span.text.startswith(name)
