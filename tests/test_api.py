"""The Python API documented in the README."""

from __future__ import annotations

import pytest
import torch

import mloc
from mloc.api import ProgramError, SessionClosed
from tests.conftest import PROGRAMS
from tests.test_run import SMALL


def test_load_step_inspect_save_restore(tmp_path):
    prog = mloc.load(SMALL)
    before = {k: v.clone() for k, v in prog.module("net").state_dict().items()}
    prog.step()
    losses = prog.run(3)
    assert prog.steps_done == 4 and set(losses) == {"net", "weights"}
    after = prog.module("net").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    grads = prog.hypergradients()
    assert set(grads) == {"weights"} and all(torch.isfinite(g).all() for g in grads["weights"].values())
    prog.save(tmp_path / "s.pt")
    prog.run(3)
    trained = {k: v.clone() for k, v in prog.module("net").state_dict().items()}
    prog.restore(tmp_path / "s.pt")
    assert prog.steps_done == 4
    prog.run(3)
    assert all(torch.equal(trained[k], v) for k, v in prog.module("net").state_dict().items())
    assert "def outer_step(p):" in prog.source and prog.plan.edges[0].method == "neumann"


def test_a_closed_session_stays_readable_and_refuses_to_train(tmp_path):
    with mloc.load(SMALL) as prog:
        prog.run(2)
    losses = prog.losses()
    prog.save(tmp_path / "s.pt")
    for refused in (prog.step, lambda: prog.run(1), prog.hypergradients):
        with pytest.raises(SessionClosed, match="session was closed, so it cannot .*mloc.load it again"):
            refused()
    assert prog.steps_done == 2 and prog.losses() == losses and prog.module("net") is not None
    again = mloc.load(SMALL)
    again.restore(tmp_path / "s.pt")
    assert again.steps_done == 2
    again.run(1)


def test_load_reports_program_errors(tmp_path):
    bad = tmp_path / "bad.mlo"
    bad.write_text("program p\nproblem a { module = lib.X() }\n")
    with pytest.raises(ProgramError) as err:
        mloc.load(bad)
    assert {d.code for d in err.value.diagnostics} == {"E101", "E201"}


def test_overrides_through_the_api():
    prog = mloc.load(PROGRAMS / "hpo.mlo", set=["decay->model.unroll=5"])
    assert prog.plan.periods["decay"] == 5
