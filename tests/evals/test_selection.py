"""Named evaluations, the best checkpoint, early stopping and summary.json.

The program (`scripted.mlo`) has one parameter w that plain SGD moves to exactly k after k
steps, and an evaluation that returns the k-th value of a list written in the program:
every value the run sees is known, so the best step, its value and the stopping step are
computed by hand below (the closed form of the rule in `mloc.runtime.run.selection`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import mloc

from mloc.codegen.compile import compile_program, load_generated
from mloc.runtime.program.checkpoint import load_checkpoint
from mloc.runtime.processes.launch import run
from mloc.runtime.run.selection import Tracker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROGRAM = (HERE / "scripted.mlo").read_text()
# acc at steps 1..20: best 0.7 at step 4, then 0.6, 0.65, 0.69 -> three evaluations without
# improvement, so `stop ... for 3 evals` stops after step 7.
VALUES = [0.2, 0.5, 0.4, 0.7, 0.6, 0.65, 0.69, 0.3, 0.1] + [0.0] * 11


def compile_declaration(tmp_path: Path, text: str = PROGRAM):
    (tmp_path / "scripted.py").write_text((HERE / "scripted.py").read_text())
    (tmp_path / "p.mlo").write_text(text)
    c = compile_program(str(tmp_path / "p.mlo"), out_dir=tmp_path)
    assert c.ok, [str(d) for d in c.diagnostics]
    return load_generated(c.source, str(tmp_path / "train.py"))


def train(declaration, out: Path, steps: int, resume: bool = False) -> int:
    torch.set_num_threads(1)
    config = replace(declaration.defaults, steps=steps)
    return run(declaration, config, out, out if resume else None, quiet=True)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def best_pt(out: Path) -> dict:
    state = load_checkpoint(out / "best.pt", "scripted")
    return {**state["best"], "w": float(state["problems"]["counter"]["params"][0]), "at": state["step"]}


# --- the rule, on its own -------------------------------------------------------------------

def _steps(tracker: Tracker, values) -> list[tuple[bool, int]]:
    return [(tracker.update(i + 1, v), tracker.stale) for i, v in enumerate(values)]


def test_max_improves_only_when_strictly_higher_ties_keep_the_first():
    t = Tracker("acc", "max", patience=2)
    assert _steps(t, [0.5, 0.5, 0.7, 0.6]) == [(True, 0), (False, 1), (True, 0), (False, 1)]
    assert (t.value, t.step, t.exhausted) == (0.7, 3, False)
    t.update(5, 0.7)
    assert t.exhausted and t.step == 3


def test_min_with_min_delta_counts_small_improvements_as_none():
    t = Tracker("loss", "min", min_delta=0.1, patience=3)
    # 1.0 first; 0.95 is better by 0.05 < 0.1: not an improvement; 0.85 is by 0.15: it is
    assert _steps(t, [1.0, 0.95, 0.85, 0.8, 0.78]) == [(True, 0), (False, 1), (True, 0), (False, 1), (False, 2)]
    assert (t.value, t.step) == (0.85, 3)


def test_nan_never_improves_even_first():
    t = Tracker("acc", "max", patience=2)
    assert _steps(t, [math.nan, 0.1, math.nan]) == [(False, 1), (True, 0), (False, 1)]
    assert t.best() == {"metric": "acc", "mode": "max", "step": 2, "value": 0.1}


# --- runs -----------------------------------------------------------------------------------

def test_best_checkpoint_early_stop_and_summary(tmp_path):
    declaration = compile_declaration(tmp_path)
    out = tmp_path / "run"
    assert train(declaration, out, 20) == 0
    assert best_pt(out) == {"metric": "acc", "mode": "max", "step": 4, "value": 0.7, "w": 4.0, "at": 4}
    assert load_checkpoint(out / "checkpoint.pt", "scripted")["step"] == 7
    assert summary(out) == {"status": "stopped_early", "steps_done": 7,
                            "best": {"metric": "acc", "mode": "max", "step": 4, "value": 0.7},
                            "final": {"acc": 0.69}}
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["value"]) for r in evals if r.get("eval") == "acc"] == \
        [(k, VALUES[k - 1]) for k in range(1, 8)]
    assert [r["step"] for r in evals if r.get("kind") == "summary"] == [7]      # metrics.jsonl's closing record
    session = mloc.load(tmp_path / "p.mlo")           # best.pt is a checkpoint like any other
    session.restore(out / "best.pt")
    assert session.steps_done == 4 and session.evaluate() == {"acc": 0.7}


def test_resume_keeps_the_best_and_the_patience_count(tmp_path):
    """Stopped at step 5 (best 0.7 at 4, one evaluation without improvement), resumed to
    20: the run stops at 7 as the uninterrupted one does (a lost count would stop at 8),
    and best.pt is the one written at step 4, untouched."""
    declaration = compile_declaration(tmp_path)
    out = tmp_path / "run"
    assert train(declaration, out, 5) == 0
    assert summary(out)["status"] == "finished" and summary(out)["steps_done"] == 5
    before = (out / "best.pt").read_bytes()
    assert train(declaration, out, 20, resume=True) == 0
    assert load_checkpoint(out / "checkpoint.pt", "scripted")["step"] == 7
    assert summary(out) == {"status": "stopped_early", "steps_done": 7,
                            "best": {"metric": "acc", "mode": "max", "step": 4, "value": 0.7},
                            "final": {"acc": 0.69}}
    assert (out / "best.pt").read_bytes() == before


def test_resume_from_before_the_best_moves_it(tmp_path):
    declaration = compile_declaration(tmp_path)
    out = tmp_path / "run"
    assert train(declaration, out, 3) == 0
    assert best_pt(out)["step"] == 2
    assert train(declaration, out, 20, resume=True) == 0
    assert best_pt(out) == {"metric": "acc", "mode": "max", "step": 4, "value": 0.7, "w": 4.0, "at": 4}
    assert summary(out)["steps_done"] == 7


def test_min_mode_min_delta_every_two_steps_and_no_best_file(tmp_path):
    # evaluations at steps 2, 4, 6, 8, 10 see 1.0, 0.95, 0.85, 0.8, 0.78: with min_delta 0.1
    # the best is 0.85 (step 6), and steps 8 and 10 do not improve on it: stop after 10
    values = [0.0, 1.0, 0.0, 0.95, 0.0, 0.85, 0.0, 0.8, 0.0, 0.78] + [0.0] * 10
    assert str(VALUES) in PROGRAM
    text = PROGRAM.replace("eval acc every 1", "eval loss every 2").replace(str(VALUES), str(values))
    text = text.replace("    checkpoint best on max acc\n", "").replace(
        "stop when acc has not improved for 3 evals", "stop when min loss has not improved by 0.1 for 2 evals")
    declaration = compile_declaration(tmp_path, text)
    out = tmp_path / "run"
    assert train(declaration, out, 20) == 0
    assert summary(out) == {"status": "stopped_early", "steps_done": 10,
                            "best": {"metric": "loss", "mode": "min", "step": 6, "value": 0.85},
                            "final": {"loss": 0.78}}
    assert not (out / "best.pt").exists()


def test_named_dict_metrics_and_unnamed_default_name(tmp_path):
    text = PROGRAM.replace("lib.scripted(counter", "lib.scripted_dict(counter").replace(
        "checkpoint best on max acc", "checkpoint best on max acc.top1").replace(
        "stop when acc has", "stop when acc.top1 has")
    text = text.replace("    log every 5", "    eval every 4 = lib.scripted(counter, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])\n    log every 5")
    declaration = compile_declaration(tmp_path, text)
    assert [(e.name, e.named) for e in declaration.evaluations] == [("acc", True), ("scripted", False)]
    out = tmp_path / "run"
    assert train(declaration, out, 20) == 0
    assert summary(out) == {"status": "stopped_early", "steps_done": 7,
                            "best": {"metric": "acc.top1", "mode": "max", "step": 4, "value": 0.7},
                            "final": {"acc.top1": 0.69, "acc.step": 7.0, "scripted": 4.0}}


def test_an_evaluation_failing_mid_run_writes_a_failed_summary(tmp_path, capsys):
    text = PROGRAM.replace("0.4, 0.7", "0.4, 'oops'")
    declaration = compile_declaration(tmp_path, text)
    out = tmp_path / "run"
    assert train(declaration, out, 20) == 1
    assert "error[E702]" in capsys.readouterr().err
    s = summary(out)
    assert (s["status"], s["steps_done"], s["best"]["step"]) == ("failed", 4, 2)
    assert "returned a str" in s["error"]


def test_the_trial_reports_bad_evaluations_and_leaves_the_rngs_alone(tmp_path):
    """Before training, at the evaluation's call: a value that is no metric is E707, a
    call that raises E702; compiling draws nothing from torch's generator."""
    call = PROGRAM[PROGRAM.index("lib.scripted("):PROGRAM.index(")", PROGRAM.index("lib.scripted(")) + 1]
    line = PROGRAM[:PROGRAM.index(call)].count("\n") + 1
    col = PROGRAM.splitlines()[line - 1].index(call) + 1
    cases = [(call.replace("[0.2,", "['x',"), "E707", "returns a str"),
             ("lib.raising_at(counter, at=0)", "E702", "evaluation data missing at step 0")]
    for replacement, code, words in cases:
        (tmp_path / "scripted.py").write_text((HERE / "scripted.py").read_text())
        (tmp_path / "p.mlo").write_text(PROGRAM.replace(call, replacement))
        torch.manual_seed(123)
        before = torch.get_rng_state()
        c = compile_program(str(tmp_path / "p.mlo"), out_dir=tmp_path)
        assert torch.equal(torch.get_rng_state(), before)
        assert [(d.code, d.span.line, d.span.col) for d in c.diagnostics] == [(code, line, col)]
        assert words in c.diagnostics[0].message


def test_the_run_names_the_best_step_and_the_early_stop(tmp_path, capsys):
    declaration = compile_declaration(tmp_path)
    assert run(declaration, replace(declaration.defaults, steps=20), tmp_path / "run", None, quiet=False) == 0
    text = "".join(capsys.readouterr())
    assert "stopped early at step 7: acc has not improved for 3 evaluations" in text
    assert "best acc = 0.7 at step 4" in text and "done: 7 steps" in text


@pytest.mark.slow
def test_nproc_2_stops_every_rank_at_the_same_step(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(HERE / "scripted.mlo"), "--out", str(tmp_path / "r"),
                           "--nproc", "2", "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert best_pt(tmp_path / "r")["step"] == 4
    assert summary(tmp_path / "r")["steps_done"] == 7
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt", "scripted")["step"] == 7
