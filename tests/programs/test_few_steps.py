"""Every example program runs: `mloc run` of each `programs/*.mlo` for 2 outer steps, eager,
one thread, in this process (issue 27: "a CI test runs every program for a few steps"; one
full seed of each is `test_full_seed.py`'s, in the slow tier). A new program is picked up by
the glob; what it must do to pass is start, train and finish: exit 0, a summary at step 2,
and finite losses."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import PROGRAMS

EXAMPLES = sorted(PROGRAMS.glob("*.mlo"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_program_runs_two_steps(path, tmp_path, mloc_here):
    out = tmp_path / "run"
    ran = mloc_here("run", path, "--steps", 2, "--compile", "off", "--threads", 1, "--quiet", "--out", out)
    assert ran.returncode == 0, ran.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["step"] == 2, summary
    losses = [v for r in records if r["kind"] == "train" for k, v in r.items() if k == "loss"]
    losses += [v for k, v in summary["final"].items() if k.endswith("/loss")]
    assert losses and all(math.isfinite(v) for v in losses), records
