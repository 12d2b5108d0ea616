"""A Python optimizer's arguments are judged by its class before training (issue 22: a
wrong keyword of `torch.optim.RAdam` was exit 101, "a bug in mloc"): `mloc run` reports
the class's own refusal as E702 at the optimizer the program names, exit 1, no folder."""

from __future__ import annotations

import pytest

from tests.run.helpers import SMALL, mloc


@pytest.mark.parametrize("call, says", [
    ("torch.optim.RAdam(lr=0.1, bogus=1)", "TypeError: RAdam.__init__() got an unexpected keyword argument 'bogus'"),
    ("torch.optim.RAdam(lr=0.1, betas=(2.0, 0.9))", "ValueError: Invalid beta parameter at index 0: 2.0"),
])
def test_a_python_optimizer_that_refuses_its_arguments_is_the_programs_error(tmp_path, call, says, mloc_here):
    proc = mloc_here("run", SMALL, "--steps", 2, "--out", tmp_path / "run", "--quiet", "--set", f"weights.optimizer={call}")
    assert proc.returncode == 1, proc.stderr
    assert f"error[E702]: building `{call}` on the parameters of `weights` raised {says}" in proc.stderr
    assert "E900" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_the_same_class_with_its_own_arguments_trains(tmp_path, mloc_here):
    proc = mloc_here("run", SMALL, "--steps", 2, "--out", tmp_path, "--quiet", "--set",
                "weights.optimizer=torch.optim.RAdam(lr=0.1, betas=(0.8, 0.9))")
    assert proc.returncode == 0, proc.stderr
