"""A device that is not there is refused before the compile runs the program's code (issue
22, item 13): `mloc run --device cuda` on a machine without CUDA was exit 2 only after the
trace (~25 s on a real program). The program here cannot even be traced (its module raises
when imported), so an exit 2 naming the device shows that the refusal came first; with
`--device cpu` the same program fails at the trace (exit 1), as a control. The train
block's own `device = cuda` is refused at the same point, once the checks have read it."""

from __future__ import annotations

import pytest
import torch

from tests.run.helpers import SMALL, mloc

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")

NOT_THERE = "error: device cuda:0 is not available: this machine has no CUDA device"


@pytest.fixture
def program(tmp_path):
    """small.mlo with a module that raises when the trace imports it (the checks read its
    source, which defines every name the program uses)."""
    (tmp_path / "probe.py").write_text(SMALL.with_suffix(".py").read_text()
                                       + "\nraise RuntimeError('the trace imported the program module')\n")
    path = tmp_path / "probe.mlo"
    path.write_text(SMALL.read_text().replace("import small as lib", "import probe as lib"))
    return path


def test_run_device_cuda_is_refused_before_the_trace(program, tmp_path, mloc_here):
    proc = mloc_here("run", program, "--device", "cuda", "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert NOT_THERE in proc.stderr and "= help: use --device cpu" in proc.stderr, proc.stderr
    assert "imported the program module" not in proc.stderr
    assert not (tmp_path / "run").exists()
    control = mloc_here("run", program, "--device", "cpu", "--out", tmp_path / "run", "--quiet")
    assert control.returncode == 1 and "imported the program module" in control.stderr, control.stderr


def test_the_train_blocks_device_is_refused_before_the_trace(program, tmp_path, mloc_here):
    program.write_text(program.read_text().replace("device = cpu", "device = cuda"))
    proc = mloc_here("run", program, "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert NOT_THERE in proc.stderr and "imported the program module" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_nproc_device_cuda_is_refused_before_the_trace(program, tmp_path, mloc_here):
    proc = mloc_here("run", program, "--device", "cuda", "--nproc", 2, "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert "error: --nproc 2 on CUDA needs 2 devices, one per process; this machine has no CUDA device" \
        in proc.stderr, proc.stderr
    assert "imported the program module" not in proc.stderr
