"""`mloc run --compile on|off`: resumed runs are bitwise the uninterrupted run within one
mode, in separate processes (different `PYTHONHASHSEED`s); the run says how each step ran
and records it; `recompiles` in the metrics is 0 in steady state; `auto` says what it
decided and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.run.helpers import same_state

SMALL = ROOT / "tests" / "run" / "small.mlo"


def _mloc(*argv, hashseed: str):
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    return subprocess.run([sys.executable, "-m", "mloc", *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=900)


@pytest.mark.slow
def test_a_compiled_run_resumed_is_bitwise_the_uninterrupted_one(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    done = _mloc("run", SMALL, "--compile", "on", "--steps", 12, "--out", whole, hashseed="1")
    assert done.returncode == 0, done.stderr
    assert "compile: upper step of weights: compiled" in done.stdout + done.stderr
    first = _mloc("run", SMALL, "--compile", "on", "--steps", 6, "--out", part, hashseed="2")
    assert first.returncode == 0, first.stderr
    again = _mloc("run", SMALL, "--compile", "on", "--resume", part, "--steps", 12, hashseed="3")
    assert again.returncode == 0, again.stderr
    assert same_state(whole, part)
    config = json.loads((whole / "config.json").read_text())["run"]
    assert config["compile"] == "on"
    assert {c["step"]: (c["compiled"], c["update"]) for c in config["compiled"]} == {
        "lower net": (True, "fused"), "upper weights": (True, "fused")}     # the commits ran in their graphs
    assert all(c["compile_seconds"] > 0 for c in config["compiled"])
    trains = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    by_problem = {}
    for r in trains:
        if r["kind"] == "train":
            by_problem.setdefault(r["problem"], []).append(r["recompiles"])
    # steady state: none after the first log (SGD's first momentum step is a graph of its own, once)
    assert by_problem and all(len(set(counts)) == 1 and counts[0] <= 1 for counts in by_problem.values())


@pytest.mark.slow
def test_an_eager_run_resumed_is_bitwise_and_differs_from_nothing_it_should_not(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert _mloc("run", SMALL, "--compile", "off", "--steps", 12, "--out", whole, hashseed="1").returncode == 0
    assert _mloc("run", SMALL, "--compile", "off", "--steps", 6, "--out", part, hashseed="2").returncode == 0
    assert _mloc("run", SMALL, "--compile", "off", "--resume", part, "--steps", 12, hashseed="3").returncode == 0
    assert same_state(whole, part)
    config = json.loads((whole / "config.json").read_text())["run"]
    assert config["compile"] == "off" and "compiled" not in config


def test_auto_on_a_short_run_stays_eager_and_says_why(mloc_here, tmp_path):
    out = tmp_path / "run"
    ran = mloc_here("run", SMALL, "--steps", 10, "--out", out)
    assert ran.returncode == 0, ran.stderr
    said = ran.stdout + ran.stderr
    assert "compile: off (4 steps left × " in said and "expected to compile 2 step kinds" in said
    config = json.loads((out / "config.json").read_text())["run"]
    assert config["compile"] == "auto"
    assert config["compile_decision"]["compile"] is False and config["compile_decision"]["at_step"] == 6
    # resumed, the run keeps its decision (timed again, a loaded machine could decide
    # otherwise, and a compiled step is not bitwise an eager one)
    again = mloc_here("run", SMALL, "--steps", 20, "--resume", out)
    assert again.returncode == 0, again.stderr
    said = again.stdout + again.stderr
    assert "compile: off (the decision this run made at step 6, kept on resume" in said, said
    assert "steps left ×" not in said, said
    resumes = json.loads((out / "config.json").read_text())["resumes"]
    assert "compile_decision" not in resumes[-1]


def test_fp16_loss_scaling_runs_its_steps_eagerly_with_the_reason():
    """A loss scaler seeds the loss with its current scale, step by step: the scaled step
    runs eagerly and says so; the commit is still compiled (which rounds differently from
    the eager commit: within float32's 1e-5)."""
    import mloc
    from mloc.runtime.compiled.step import StepReport

    def run(mode):
        session = mloc.load(SMALL, compile=mode)
        lv = session.program.live["net"]
        lv.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)     # fp16's logic, on the CPU
        for _ in range(3):
            session.program.lower_step("net")
        return session, lv
    eager, _ = run("off")
    compiled, lv = run("on")
    for a, b in zip(eager.program.live["net"].problem.params, lv.problem.params):
        assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-5
    report = compiled.program.compiling.reports["lower", "net"]
    assert isinstance(report, StepReport) and not report.compiled
    assert report.line() == "lower step of net: eager (loss scaling seeds the loss with the scaler's current scale)"
    assert compiled.program.compiling.reports["commit", "net"].compiled
    assert not report.fused and "fp16 loss scaling" in report.split      # the update stays apart


@pytest.mark.slow
def test_nproc_compiles_its_lower_and_upper_steps_with_the_collectives_in_the_graph(tmp_path):
    """`--nproc 2 --compile on`: the lower step and the upper (whose hypergradient averages
    its direct gradient and Hessian-vector products across processes inside the step: as
    functional collectives in its graph) are compiled, their updates apart (the final
    gradients' all-reduce between gradient and update); the run equals `--compile off`
    within float32's 1e-5 and counts the same collectives per step."""
    from tests.run.helpers import params
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        done = _mloc("run", SMALL, "--compile", mode, "--nproc", 2, "--threads", 1, "--steps", 8, "--out", out,
                     hashseed="1")
        assert done.returncode == 0, done.stderr
        runs[mode] = out
    config = json.loads((runs["on"] / "config.json").read_text())["run"]
    steps = {c["step"]: c for c in config["compiled"]}
    assert steps["lower net"]["compiled"] and steps["commit net"]["compiled"], steps
    assert steps["upper weights"]["compiled"] and steps["upper weights"]["recompiles"] == 0, steps
    for step in ("lower net", "upper weights"):
        assert "averaged across processes between the gradient and the update" in steps[step]["update"]
    a, b = params(runs["on"]), params(runs["off"])
    assert a.keys() == b.keys()
    for k in a:
        assert ((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() <= 1e-5, k

    def collectives(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return {(r["step"], r["problem"]): r["collectives"] for r in rows if r["kind"] == "train"}
    assert collectives(runs["on"]) == collectives(runs["off"])
