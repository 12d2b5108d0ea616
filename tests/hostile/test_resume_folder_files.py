"""`mloc run --resume` on a folder whose files mloc cannot read is exit 2 naming the file
(issue 23 item 8); a symlinked metrics.jsonl is replaced, its target untouched."""

from __future__ import annotations

import json

import pytest

from tests.run.helpers import mloc

SMALL = "tests/run/small.mlo"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("r") / "run"
    r = mloc("run", SMALL, "--steps", "5", "--out", str(d), "--threads", "1")
    assert r.returncode == 0, r.stderr
    return d


@pytest.mark.parametrize("file, data", [("config.json", b'{"run": "x"}'),
                                        ("config.json", b'{"run": {"steps": 5}, "resumes": 3}'),
                                        ("config.json", b'{"run": {"steps": 5, "seed": 1' + b'0' * 30 + b'}}'),
                                        ("config.json", b'{"run": {"steps": 1' + b'0' * 20 + b'}}'),
                                        ("metrics.jsonl", b'{"step": 1}\n\xff\n')])
def test_resume_names_the_unreadable_file(run_dir, tmp_path, file, data, mloc_here):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    (d / ".lock").unlink(missing_ok=True)
    (d / file).write_bytes(data)
    r = mloc_here("run", SMALL, "--resume", str(d), "--steps", "10", "--threads", "1")
    assert r.returncode == 2, r.stderr
    assert f"cannot read {d / file}" in r.stderr


def test_a_symlinked_metrics_file_is_replaced_and_its_target_left_as_it_was(run_dir, tmp_path, mloc_here):
    """A run appends to its own `metrics.jsonl`, never through a link to a file elsewhere
    (as a symlinked checkpoint is replaced, not written through)."""
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes((d / "metrics.jsonl").read_bytes())
    before = outside.read_bytes()
    (d / "metrics.jsonl").unlink()
    (d / "metrics.jsonl").symlink_to(outside)
    r = mloc_here("run", SMALL, "--resume", str(d), "--steps", "10", "--threads", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    assert outside.read_bytes() == before
    assert not (d / "metrics.jsonl").is_symlink()
    steps = [json.loads(line)["step"] for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 10 and min(steps) >= 1


def test_resume_with_the_csv_logger_names_a_metrics_csv_that_is_not_utf8(run_dir, tmp_path, mloc_here):
    """`--logger csv` keeps metrics.csv one history on resume, so it reads it: a byte that is
    not UTF-8 there is exit 2 naming the file, before a step is trained. (`mloc plot` and
    `mloc runs` read metrics.jsonl only: tests/hostile/test_run_folder_files.py.)"""
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    (d / "metrics.csv").write_bytes(b"step,time,kind,name,value\n5,1.0,train,net/loss,\xff\n")
    before = (d / "checkpoint.pt").read_bytes()
    r = mloc_here("run", SMALL, "--resume", str(d), "--steps", "10", "--threads", "1", "--logger", "csv")
    assert r.returncode == 2, r.stderr
    assert f"cannot read {d / 'metrics.csv'}: it is not UTF-8 (byte 0xff" in r.stderr, r.stderr
    assert (d / "checkpoint.pt").read_bytes() == before
