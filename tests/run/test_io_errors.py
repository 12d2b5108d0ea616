"""mloc's own I/O failures are the user's environment, not bugs in mloc (issue 10, case 3):
exit 2, one line naming the path and the operating system's reason, the previous
checkpoint intact and no temporary file left behind."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest

from mloc.cli import main
from tests.conftest import ROOT
from tests.run.helpers import ENV, SMALL, step_of


def run(*argv) -> int:
    return main(["run", str(SMALL), "--quiet", "--device", "cpu", *map(str, argv)])


@pytest.mark.parametrize("case,reason", [("file", "Not a directory"), ("under_file", "Not a directory"),
                                         ("too_long", "File name too long")])
def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, case, reason):
    (tmp_path / "afile").write_text("not a folder")
    out = {"file": tmp_path / "afile", "under_file": tmp_path / "afile" / "run",
           "too_long": tmp_path / ("x" * 300)}[case]
    assert run("--steps", 2, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot ") and f"{out}: {reason}" in err, err
    assert (tmp_path / "afile").read_text() == "not a folder"


def inject(mode: str, n: int, *argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.run._inject", mode, str(n), "run", str(SMALL), "--quiet",
                           *map(str, argv)], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300, **kw)


def assert_intact(run_dir, before: bytes, step: int) -> None:
    assert (run_dir / "checkpoint.pt").read_bytes() == before and step_of(run_dir) == step
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_during_a_checkpoint_write(tmp_path):
    """The disk fills up halfway through the second checkpoint (ENOSPC from the write)."""
    proc = inject("enospc", 2, "--steps", 20, "--out", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: cannot write {tmp_path / 'checkpoint.pt'}: No space left on device\n"
    assert step_of(tmp_path) == 5 and not list(tmp_path.glob(".*.tmp"))


def _limit_file_size(limit: int):
    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def test_a_file_size_limit_from_the_kernel_during_a_checkpoint_write(tmp_path):
    """A real refusal by the kernel (RLIMIT_FSIZE: EFBIG) while a resumed run writes its
    checkpoint: the previous one is intact, nothing is left behind."""
    assert run("--steps", 5, "--out", tmp_path) == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()
    limit = len(before) // 2
    assert max(p.stat().st_size for p in tmp_path.iterdir() if p.name != "checkpoint.pt") < limit
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(SMALL), "--quiet", "--steps", "8",
                           "--resume", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=300, preexec_fn=_limit_file_size(limit))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: cannot write {tmp_path / 'checkpoint.pt'}: File too large\n"
    assert_intact(tmp_path, before, 5)
