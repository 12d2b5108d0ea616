"""`--nproc 2 --compile on` against `--nproc 2 --compile off` for every hypergradient
method in the registry (slow tier; registry-parametrised as
`tests/runtime_loop/test_overlap_nproc.py`, with SAMA over Adam too): the upper step's
averaging (its direct gradient, each Hessian-vector product, SAMA's lower and perturbed
gradients) runs in its compiled graph as functional collectives
(`mloc.runtime.base.overlap._Captured`), and the run equals the eager one within float32's
1e-5 relative (the compiled graph rounds its fused loops differently; the eager `--nproc 2`
run equals one process on batch 2B, `tests/runtime_loop/test_distributed.py`), counts the
same collectives per outer step, and compiles nothing after its first steps."""

from __future__ import annotations

import json

import pytest

from tests.compiled.test_compiled_runs import SMALL, _mloc
from tests.run.helpers import params
from tests.runtime_loop.test_overlap_nproc import CASES


def _records(out) -> dict:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], r["problem"]): r for r in rows if r["kind"] == "train"}


@pytest.mark.slow
@pytest.mark.parametrize("method,optimizer", CASES)
def test_nproc_compiled_equals_nproc_eager(tmp_path, method, optimizer):
    sets = ["--set", f"weights->net.hypergrad={method}", "--set", f"net.optimizer={optimizer}"]
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        done = _mloc("run", SMALL, "--compile", mode, "--nproc", 2, "--threads", 1, "--steps", 10, "--out", out,
                     "--quiet", *sets, hashseed="1")
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = out
    config = json.loads((runs["on"] / "config.json").read_text())["run"]
    steps = {c["step"]: c for c in config["compiled"]}
    assert steps["upper weights"]["compiled"], steps["upper weights"]
    a, b = params(runs["on"]), params(runs["off"])
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            err = float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30))
            assert err <= 1e-5, (k, err)
    on, off = _records(runs["on"]), _records(runs["off"])
    assert {k: r["collectives"] for k, r in on.items()} == {k: r["collectives"] for k, r in off.items()}
    recompiles = [r["recompiles"] for k, r in sorted(on.items()) if k[1] == "weights"]
    assert len(set(recompiles)) == 1, recompiles        # none after the first log (step 5)
