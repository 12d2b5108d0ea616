"""Rerunning a sweep (mloc/cli/sweep_folder.py): what each point's folder needs, and the
folder rule, through `mloc sweep`. Before this change every rerun into the same `--out`
was refused (exit 2, "not empty")."""

from __future__ import annotations

import json

import pytest

from mloc.cli.sweep_folder import next_step
from tests.run.helpers import SMALL, mloc


def test_each_point_is_skipped_resumed_or_started_again_by_what_its_folder_holds(tmp_path):
    def folder(name, status=None, checkpoint=False, metrics=""):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text(metrics)
        if status:
            (d / "summary.json").write_text(json.dumps({"status": status}))
        if checkpoint:
            (d / "checkpoint.pt").write_bytes(b"x")
        return d
    record = '{"step": 1}\n'
    assert next_step(folder("finished", "finished", True, record)) == "skip"
    assert next_step(folder("early", "stopped_early", True, record)) == "skip"
    assert next_step(folder("stopped", "interrupted", True, record)) == "resume"
    assert next_step(folder("killed", None, True, record)) == "resume"              # SIGKILL: no summary
    assert next_step(folder("failed", "failed", True, record)) == "overwrite"       # not from the state that failed
    assert next_step(folder("no_ckpt", None, False, record)) == "overwrite"
    assert next_step(folder("aborted", "interrupted", False, "")) == "start"
    assert next_step(tmp_path / "never") == "start"


@pytest.mark.slow
def test_rerunning_a_finished_sweep_skips_every_point_and_another_sweep_is_refused(tmp_path):
    out = tmp_path / "sweep"
    argv = ["sweep", SMALL, "--set", "net.optimizer.lr=0.1,0.05", "--steps", 2, "--out", out]
    first = mloc(*argv)
    assert first.returncode == 0, first.stderr
    before = {p.name: (p / "metrics.jsonl").read_bytes() for p in out.glob("0*")}
    again = mloc(*argv)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("finished before; skipped") == 2 and again.stdout == first.stdout, again.stderr
    assert {p.name: (p / "metrics.jsonl").read_bytes() for p in out.glob("0*")} == before
    resumed = mloc("sweep", SMALL, "--resume", "--out", out)          # the axes come from sweep.json
    assert resumed.returncode == 0 and resumed.stdout == first.stdout, resumed.stderr
    other = mloc("sweep", SMALL, "--set", "net.optimizer.lr=0.1", "--steps", 2, "--out", out)
    assert other.returncode == 2, other.stderr
    assert f"error: {out} holds another sweep (--set: " in other.stderr and "choose another --out" in other.stderr
    nothing = mloc("sweep", SMALL, "--resume", "--out", tmp_path / "empty")
    assert nothing.returncode == 2 and "holds no sweep to resume" in nothing.stderr, nothing.stderr
