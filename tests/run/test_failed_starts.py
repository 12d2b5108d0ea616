"""A start that fails before training leaves no folder that blocks the next start, and a
failed run's report agrees with its summary (docs/reliability.md, "Which folder" and
"When a run fails").

Before this change a bad `--device` left config.json, train.py, plan.json and graph.dot
in the --out folder: the next `--out` there said "already holds a run ... --resume", and
`--resume` said "holds no checkpoint.pt". A NaN found at the check after step 4 said "at
step 1" while summary.json said 4 steps done, and pointed at a checkpoint that did not exist.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from mloc.runtime.files.runfolder import choose, holds_run
from tests.run.helpers import FAULTY, HERE, mloc

NOCKPT = HERE / "nockpt.mlo"


def test_a_device_that_is_not_there_fails_before_the_folder_is_made(tmp_path, mloc_here):
    out = tmp_path / "run"
    proc = mloc_here("run", NOCKPT, "--device", "cuda:99", "--out", out, "--steps", 2, "--quiet")
    assert proc.returncode == 2 and "device cuda:99 is not available" in proc.stderr, proc.stderr
    assert not out.exists()
    build = mloc_here("compile", NOCKPT, "-o", tmp_path / "build")
    assert build.returncode == 0, build.stderr
    proc = subprocess.run([sys.executable, str(tmp_path / "build" / "train.py"), "--device", "cuda:99", "--out",
                           str(out), "--steps", "2", "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "device cuda:99 is not available" in proc.stderr, proc.stderr
    assert not out.exists()


def _failed_start(folder):
    """What a start that failed before its first step leaves (a logger that did not open)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run": {"steps": 30}, "resumes": []}))
    for name in ("train.py", "plan.json", "graph.dot", "metrics.jsonl"):
        (folder / name).write_text("")
    (folder / "summary.json").write_text(json.dumps({"status": "failed", "steps_done": 0, "error": "x"}))
    return folder


def test_a_folder_where_no_step_was_trained_is_reused(tmp_path, mloc_here):
    folder = _failed_start(tmp_path / "run")
    assert not holds_run(folder)
    assert choose(folder, None, False, "x").clear          # its config.json starts afresh
    proc = mloc_here("run", NOCKPT, "--out", folder, "--steps", 4, "--quiet")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((folder / "config.json").read_text())
    assert config["run"]["steps"] == 4 and config["resumes"] == []
    assert json.loads((folder / "summary.json").read_text())["status"] == "finished"


def test_resuming_a_folder_where_no_step_was_trained_says_to_start_it(tmp_path, mloc_here):
    folder = _failed_start(tmp_path / "run")
    proc = mloc_here("run", NOCKPT, "--resume", folder, "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert "holds no checkpoint.pt" in proc.stderr and f"--out {folder}" in proc.stderr, proc.stderr
    assert "pass the --out folder of an earlier run" not in proc.stderr


def test_a_folder_that_trained_still_blocks_a_new_start(tmp_path, mloc_here):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"kind": "train", "step": 4}\n')
    assert holds_run(folder)
    proc = mloc_here("run", NOCKPT, "--out", folder, "--steps", 4, "--quiet")
    assert proc.returncode == 2 and "already holds a run" in proc.stderr


@pytest.mark.parametrize("program, checkpoint", [(NOCKPT, False), (FAULTY, True)])
def test_the_nan_report_agrees_with_the_summary(tmp_path, program, checkpoint):
    proc = mloc("run", program, "--out", tmp_path, "--quiet", "--set", "weights.loss=lib.ce_nan(net, batch, after=12)")
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    done = summary["steps_done"]
    bad = int(re.search(r"became NaN or Inf at step (\d+)", proc.stderr).group(1))
    assert bad <= done
    assert f"found by the check after step {done}" in proc.stderr, proc.stderr
    assert ("checkpoint.pt" in proc.stderr) == checkpoint == (tmp_path / "checkpoint.pt").is_file(), proc.stderr
    assert "(if one was written)" not in proc.stderr


@pytest.mark.parametrize("flags, said", [
    (["--precision", "bf16"], "--precision bf16 would do nothing in a --dtype float64 run"),
    (["--set", "net.precision=bf16"], "`net`'s precision = bf16 would do nothing in a --dtype float64 run"),
])
def test_mixed_precision_in_a_float64_run_is_refused_before_the_folder_is_made(tmp_path, mloc_here, flags, said):
    """Autocast lowers float32 operations only: bf16 in a float64 run used to train in float64,
    bit for bit the fp32 run, under a banner saying "precision bf16"."""
    out = tmp_path / "run"
    proc = mloc_here("run", NOCKPT, "--dtype", "float64", *flags, "--out", out, "--steps", 2, "--quiet")
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert "autocast lowers float32 operations only" in proc.stderr and "help:" in proc.stderr
    assert not out.exists()


def test_mixed_precision_in_a_float64_session_is_refused():
    import mloc
    from mloc.runtime.base.precision import DeviceError
    with pytest.raises(DeviceError, match="would do nothing in a --dtype float64 run"):
        mloc.load(NOCKPT, dtype="float64", precision="bf16")
    mloc.load(NOCKPT, dtype="float64", precision="fp32").close()
