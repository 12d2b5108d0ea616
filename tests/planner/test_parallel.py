"""The plan's `--nproc` lines (`mloc.passes.parallel`): the synchronised backwards of one
outer step, from each method's `SyncCaps` and the lower optimizer's `diag_reads_grad`."""

from __future__ import annotations

import importlib
import typing

import pytest

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.cli import main
from tests.conftest import PROGRAMS

REWEIGHTING = str(PROGRAMS / "data_reweighting.mlo")


def _plan(capsys, *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    assert main(["plan", REWEIGHTING, *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("sets,line", [
    ((), "  upper_step weight_net: 2 (sama: the upper's gradient; the hypergradient)"),
    (("classifier.optimizer=adam(lr=0.01)",), "  upper_step weight_net: 3 (sama: the upper's gradient; "
                                               "the lower gradient its diagonal reads; the hypergradient)"),
    (("weight_net->classifier.hypergrad=cg(iters=4)",),
     "  upper_step weight_net: 6 (cg: the upper's gradient; 4 Hessian-vector products; the hypergradient)"),
    (("weight_net->classifier.hypergrad=first_order",), "  upper_step weight_net: 1 (first_order: the hypergradient)"),
])
def test_the_plan_says_what_each_step_synchronises(capsys, sets, line):
    out = _plan(capsys, *sets)
    assert "  lower_step classifier: 1 (its gradient)" in out
    assert line in out, out


def test_every_sync_capability_names_a_parameter_and_matches_the_runtime():
    """`SyncCaps.hvps` names an argument of its method; `OptimizerCaps.diag_reads_grad` is
    the runtime optimizer's `diag_uses_grad`."""
    for name, d in METHODS.items():
        if d.caps.sync.hvps is not None:
            assert d.caps.sync.hvps in {p.name for p in d.signature.params}, name
    for name, d in OPTIMIZERS.items():
        if d.caps.sama_diag:
            module, attr = d.runtime.split(":")
            factory = getattr(importlib.import_module(module), attr)
            cls = typing.get_type_hints(factory)["return"]
            assert cls.diag_uses_grad == d.caps.diag_reads_grad, name
