"""`mloc hypergrad --json --dtype float64` on oracles Q and T written as .mlo programs
equals the closed-form hypergradients (shared/reference/hypergradients.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from mloc.cli import main

HERE = Path(__file__).parent / "oracle_programs"
sys.path.insert(0, str(HERE))
import oracles  # noqa: E402


def hypergrad(capsys, program: str, *extra: str) -> dict:
    assert main(["hypergrad", str(HERE / program), "--json", "--dtype", "float64", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def rel(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def test_oracle_q_closed_form(capsys):
    got = hypergrad(capsys, "q.mlo")
    assert rel(got["lam"]["v"], oracles.Q(0).exact()) <= 1e-8


def test_oracle_t_exact_closed_form(capsys):
    got = hypergrad(capsys, "t.mlo")
    t = oracles.T(0)
    assert rel(got["lam"]["v"], t.exact()) <= 1e-8
    assert rel(t.exact(), t.per_edge()) > 1e-2          # the two semantics really differ here


def test_oracle_t_per_edge_closed_form(capsys):
    got = hypergrad(capsys, "t.mlo", "--set", "semantics=per_edge")
    assert rel(got["lam"]["v"], oracles.T(0).per_edge()) <= 1e-8


@pytest.mark.parametrize("program", ["q.mlo", "t.mlo"])
def test_check_reports_the_relative_error(capsys, program):
    assert main(["hypergrad", str(HERE / program), "--dtype", "float64", "--check"]) == 0
    out = capsys.readouterr().out
    errors = [float(line.split()[-1]) for line in out.splitlines() if "relative error" in line]
    assert errors and max(errors) < 1e-10
