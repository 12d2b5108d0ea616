"""`mloc run --resume` on a folder whose files mloc cannot read is exit 2 naming the file
(issue 23 item 8); a symlinked metrics.jsonl is replaced, its target untouched."""

from __future__ import annotations

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
                                        ("metrics.jsonl", b'{"step": 1}\n\xff\n')])
def test_resume_names_the_unreadable_file(run_dir, tmp_path, file, data):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    (d / ".lock").unlink(missing_ok=True)
    (d / file).write_bytes(data)
    r = mloc("run", SMALL, "--resume", str(d), "--steps", "10", "--threads", "1")
    assert r.returncode == 2, r.stderr
    assert f"cannot read {d / file}" in r.stderr
