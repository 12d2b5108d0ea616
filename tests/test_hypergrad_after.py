"""`mloc hypergrad --after N`: the hypergradients after N outer steps equal the Python API's
(`mloc.load(...).run(N)`, then `hypergradients()`) bit for bit in float64, on programs with
minibatches (so the batches the last steps drew matter); `--check` compares at that same
state and those batches; bad values of N and a NaN within the N steps are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mloc
from mloc.cli import main
from tests.conftest import PROGRAMS

SMALL = Path(__file__).parent / "run" / "small.mlo"        # minibatches of 16, neumann, unroll 2
HPO_MINIBATCH = ("model.data.batch_size=50", "decay.data.batch_size=50", "decay->model.hypergrad.iters=200")


def cli(capsys, path, *extra: str) -> dict:
    assert main(["hypergrad", str(path), "--json", "--dtype", "float64", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def api(path, steps: int, sets=()) -> dict:
    prog = mloc.load(path, set=list(sets), dtype="float64")
    prog.run(steps)
    return prog.hypergradients()


def assert_bit_identical(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for up, grads in want.items():
        assert set(got[up]) == set(grads)
        for name, value in grads.items():
            assert torch.equal(torch.tensor(got[up][name], dtype=torch.float64), value), f"{up}.{name}"


@pytest.mark.parametrize("method", ["neumann(iters=3, alpha=0.1)", "cg(iters=5)", "sama(eps=0.01)", "itd"])
def test_after_n_equals_the_python_api_bit_for_bit(capsys, method):
    sets = (f"weights->net.hypergrad={method}",)
    got = cli(capsys, SMALL, "--after", "3", *(a for s in sets for a in ("--set", s)))
    assert_bit_identical(got, api(SMALL, 3, sets))


def test_after_n_is_not_the_initial_state(capsys):
    after = cli(capsys, SMALL, "--after", "4")
    assert_bit_identical(cli(capsys, SMALL, "--after", "0"), api(SMALL, 0))
    assert_bit_identical(cli(capsys, SMALL), api(SMALL, 0))
    assert after["weights"] != cli(capsys, SMALL)["weights"]


def test_check_after_n_compares_at_the_same_state_and_batches(capsys):
    """A CG reference on fresh batches would be 1.3 away; on the same ones it agrees."""
    sets = [a for s in HPO_MINIBATCH for a in ("--set", s)]
    got = cli(capsys, PROGRAMS / "hpo.mlo", "--after", "2", "--check", *sets)
    assert got["decay"]["_relative_error"] < 1e-10
    assert_bit_identical({"decay": {"log_decay": got["decay"]["log_decay"]}},
                         api(PROGRAMS / "hpo.mlo", 2, HPO_MINIBATCH))


def test_the_text_output_says_after_how_many_steps(capsys):
    assert main(["hypergrad", str(SMALL), "--after", "2", "--check", "--color", "never"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "after 2 outer steps:" and lines[1] == "weights:"
    assert any("relative error against CG to convergence" in line for line in lines)


def test_a_negative_after_is_a_usage_error(capsys):
    assert main(["hypergrad", str(SMALL), "--after", "-1", "--color", "never"]) == 2
    err = capsys.readouterr().err
    assert "error: --after must be at least 0, got -1" in err and "= help:" in err


def test_nan_within_the_n_steps_is_an_error_naming_the_step(capsys):
    code = main(["hypergrad", str(SMALL), "--after", "20", "--color", "never",
                 "--set", "weights.loss=lib.ce_nan_after(net, batch, after=3)"])
    err = capsys.readouterr().err
    assert code == 1 and "the hypergradient of problem `weights` became NaN or Inf at step" in err
    assert "within the 20 steps of --after" in err


def test_help_documents_after(capsys):
    with pytest.raises(SystemExit):
        main(["hypergrad", "--help"])
    out = capsys.readouterr().out
    assert "--after N" in out and "--after 20 --check" in out
