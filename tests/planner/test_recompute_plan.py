"""Activation checkpointing chosen by the planner under `memory_budget`
(:mod:`mloc.passes.recompute`), printed with its reason, and a run with it equal to one
without it bitwise (the checkpointed children recompute the same operations; neumann's
Hessian-vector products and the substituted points go through them)."""

from __future__ import annotations

import json
from types import SimpleNamespace as E

from mloc.passes.recompute import decide
from tests.run.helpers import SMALL, params, same_state


def test_the_decision_and_its_reason():
    a = E(upper="u", lower="l", method="sama", memory=3 * 2**20)
    b = E(upper="u", lower="m", method="cg", memory=None)
    assert decide([a, b], None) is None                      # no budget: nothing decided
    on, why = decide([a, b], 2**20)
    assert on and why.startswith("on: the estimated step peak 3.0 MiB (u -> l, sama) exceeds memory_budget 1.0 MiB")
    on, why = decide([a], 4 * 2**20)
    assert not on and "fits memory_budget 4.0 MiB (the largest 3.0 MiB" in why
    assert decide([b], 2**20) == (False, "off: no step's memory is estimated (the sizes were not measured)")


def test_a_small_budget_checkpoints_and_trains_to_the_same_bits(mloc_here, tmp_path):
    budget = ["--set", 'train.memory_budget="1KB"']
    plan = mloc_here("plan", SMALL, *budget)
    assert plan.returncode == 0, plan.stderr
    assert "activation checkpointing: on: the estimated step peak" in plan.stdout
    assert "activation checkpointing" not in mloc_here("plan", SMALL).stdout
    data = json.loads(mloc_here("plan", SMALL, "--json", *budget).stdout)
    assert data["recompute"]["on"] is True and data["recompute"]["reason"].startswith("on: the estimated")
    common = ["--steps", "6", "--quiet", "--compile", "off", "--threads", "1"]
    ran = mloc_here("run", SMALL, *common, "--out", tmp_path / "ck", *budget)
    assert ran.returncode == 0, ran.stderr
    assert "recompute=True" in (tmp_path / "ck" / "train.py").read_text()
    assert mloc_here("run", SMALL, *common, "--out", tmp_path / "plain").returncode == 0
    assert same_state(tmp_path / "ck", tmp_path / "plain")
    assert params(tmp_path / "ck").keys() == params(tmp_path / "plain").keys()
