"""Two gloo processes: the overlapped gradient averaging (`--overlap on`, the default)
equals the flat one (`--overlap off`) within 1e-5 relative, for every hypergradient method
in the registry (slow tier); and the collectives each problem ran per outer step, in the
train records, are the plan's count (one 25 MiB bucket per backward on this small model).

Registry-parametrised as `tests/compiled/test_compiled_steps.py`: one case per method with a
runtime, and SAMA over Adam (whose diagonal reads the lower gradient: one more average)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from mloc.builtins import METHODS
from tests.conftest import ROOT
from tests.run.helpers import params

SMALL = ROOT / "tests" / "run" / "small.mlo"
ARGS = {"cg": "cg(iters=3)", "itd": "itd(steps=2)", "neumann": "neumann(iters=3, alpha=0.1)"}
CASES = [(ARGS.get(m, m), "sgd(lr=0.1, momentum=0.9)") for m, d in sorted(METHODS.items()) if d.runtime is not None]
CASES += [("sama", "adam(lr=0.01)")]


def _mloc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mloc", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _planned(sets: list[str]) -> dict[str, float]:
    """Synchronised backwards per outer step of each problem, from `mloc plan`'s lines."""
    proc = _mloc("plan", str(SMALL), *sets)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, float] = {}
    for m in re.finditer(r"^  \w+ (\w+)(?: x(\d+))?: (\d+) \(", proc.stdout, re.M):
        out[m[1]] = out.get(m[1], 0) + int(m[3]) * int(m[2] or 1)
    return out


def _counted(run) -> dict[str, float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["problem"]: r["collectives"] for r in records if r.get("kind") == "train" and "collectives" in r}


@pytest.mark.slow
@pytest.mark.parametrize("method,optimizer", CASES)
def test_overlapped_equals_flat_and_counts_what_the_plan_says(tmp_path, method, optimizer):
    sets = ["--set", f"weights->net.hypergrad={method}", "--set", f"net.optimizer={optimizer}"]
    runs = {}
    for overlap in ("on", "off"):
        out = tmp_path / overlap
        proc = _mloc("run", str(SMALL), "--steps", "10", "--out", str(out), "--quiet", "--nproc", "2",
                     "--compile", "off", "--overlap", overlap, *sets)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[overlap] = out
    on, off = params(runs["on"]), params(runs["off"])
    assert on.keys() == off.keys()
    for k in on:
        if on[k].is_floating_point():
            err = float((on[k] - off[k]).abs().max() / off[k].abs().max().clamp_min(1e-12))
            assert err <= 1e-5, (k, err)
    planned = _planned(sets)
    assert _counted(runs["on"]) == planned == _counted(runs["off"]), (method, optimizer)
