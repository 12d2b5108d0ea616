"""What `strategy = fsdp` refuses (default tier): one home, :mod:`mloc.shared.sharding`,
applied by `mloc check`/`mloc plan` (E221; E220 for the methods) and by `mloc run
--strategy fsdp` on a program compiled without it (exit 2, before anything trains), never a
traceback. The runs themselves are tests/runtime_loop/test_fsdp_run.py (slow)."""

from __future__ import annotations

import pytest

from mloc.shared.sharding import ProblemFacts, refusals
from tests.conftest import PROGRAMS
from tests.run.helpers import SMALL

REWEIGHTING = PROGRAMS / "data_reweighting.mlo"
TWO_LEVELS = (ProblemFacts("net", "sgd", uppers=("w",)), ProblemFacts("w", "adam", lowers=("net",)))


def test_a_two_level_program_with_functional_optimizers_is_not_refused():
    assert refusals(TWO_LEVELS) == []
    assert refusals(TWO_LEVELS, compile="auto") == []


@pytest.mark.parametrize("change, said", [
    ({"optimizer": "shampoo"}, "whole weight matrices"),
    ({"optimizer": "torch"}, "torch.optim"),
    ({"precision": "fp16"}, "fp16 loss scaling"),
    ({"clip": True}, "clip_grad_norm"),
    ({"init": True}, "`init`"),
    ({"reinit": True}, "`reinit`"),
    ({"project": True}, "`project`"),
    ({"accumulate": True}, "accumulation"),
    ({"lowers": ("x",)}, "three levels"),
])
def test_each_setting_is_refused_with_why_and_what_instead(change, said):
    low = ProblemFacts(**{**TWO_LEVELS[0].__dict__, **change})
    (why, help), = refusals((low, TWO_LEVELS[1]))
    assert why.startswith("`net`: ") and said in why
    assert help.endswith("or `strategy = zero` (sharded optimizer state, whole modules)")


def test_program_wide_refusals():
    assert "torch.compile" in refusals(TWO_LEVELS, compile="on")[0][0]
    assert "interlocking" in refusals(TWO_LEVELS, chains=True)[0][0]
    two_lowers = (ProblemFacts("w", "adam", lowers=("a", "b")),)
    assert "2 lower problems" in refusals(two_lowers)[0][0]


def test_plan_accepts_fsdp_for_a_two_level_first_order_program(mloc_here):
    ran = mloc_here("plan", REWEIGHTING, "--set", "train.strategy=fsdp")
    assert ran.returncode == 0, ran.stderr


def test_plan_refuses_a_setting_with_e221(mloc_here):
    ran = mloc_here("plan", REWEIGHTING, "--set", "train.strategy=fsdp", "--set", "classifier.clip_grad_norm=1.0")
    assert ran.returncode != 0 and "error[E221]" in ran.stderr and "clip_grad_norm" in ran.stderr


@pytest.mark.parametrize("extra, said", [
    ((), "`neumann` on `weights -> net`: it is not a method that runs on shards"),
    (("--set", "weights->net.hypergrad=sama", "--compile", "on"), "torch.compile"),
    (("--set", "weights->net.hypergrad=sama", "--set", "net.optimizer=shampoo(lr=0.01)"), "Shampoo"),
])
def test_run_refuses_with_exit_2_before_training(mloc_here, tmp_path, extra, said):
    ran = mloc_here("run", SMALL, "--steps", "1", "--strategy", "fsdp", "--out", tmp_path / "r", *extra)
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert "strategy fsdp cannot run this program" in ran.stderr and said in ran.stderr
    assert "Traceback" not in ran.stderr
