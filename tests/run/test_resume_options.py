"""A resume continues the run that is in the folder (issue 22, item 6): the `--set`s, steps,
device, precision and nproc its last start recorded in config.json apply unless the command
changes them, a change is shown and recorded, and a seed or dtype other than the run's is
refused (exit 2) before anything is compiled. Before, `--resume DIR` without the run's
`--set 'weights->net.unroll=3'` silently continued with the file's `unroll = 2`.
`python train.py --resume` follows the same rule, and refuses a run started with other
overrides than the ones it was compiled with."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.run.helpers import ENV, HERE, mloc, same_state, step_of

PROGRAM = HERE / "resumed.mlo"
UNROLL_3 = "weights->net.unroll=3"


def config(run_dir) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def overrides_of(run_dir) -> list[str]:
    """The `--set`s the folder's train.py was compiled with (its declaration's `overrides`)."""
    tree = ast.parse((run_dir / "train.py").read_text())
    (given,) = [k.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Declaration" for k in node.keywords if k.arg == "overrides"]
    return list(ast.literal_eval(given))     # a tuple of strings, as emitted


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_resume_without_the_set_keeps_the_runs_override_bitwise(tmp_path, mloc_here):
    """Started with unroll=3, resumed without the --set: it trains on with unroll=3 and ends
    bitwise where an uninterrupted unroll=3 run ends (the file says unroll = 2)."""
    run, full = tmp_path / "run", tmp_path / "full"
    ok(mloc_here("run", PROGRAM, "--steps", 6, "--set", UNROLL_3, "--out", run, "--quiet"))
    resumed = ok(mloc_here("run", PROGRAM, "--steps", 12, "--resume", run, "--quiet"))
    assert resumed.stderr == ""                     # nothing changed but the length
    ok(mloc_here("run", PROGRAM, "--steps", 12, "--set", UNROLL_3, "--out", full, "--quiet"))
    assert same_state(run, full)
    recorded = config(run)["resumes"][0]
    assert recorded["program"]["set"] == [UNROLL_3] and overrides_of(run) == [UNROLL_3]
    assert recorded["changes"] == [] and recorded["steps"] == 12     # more steps is no news


@pytest.mark.slow
def test_a_resume_without_steps_continues_to_the_runs_end(tmp_path):
    """A 12-step run (the file says 30) fails at step 8, its checkpoint at 5; `--resume DIR`
    alone trains to step 12 with the run's --set, as an uninterrupted 12-step run does."""
    run, full, marker = tmp_path / "run", tmp_path / "full", tmp_path / "fail"
    marker.touch()
    failing = f'weights.loss=lib.ce_failing_while(net, batch, marker="{marker}", after=7)'
    first = mloc("run", PROGRAM, "--steps", 12, "--set", failing, "--out", run, "--quiet")
    assert first.returncode == 1 and "failing while" in first.stderr, first.stderr
    assert step_of(run) == 5
    marker.unlink()
    resumed = ok(mloc("run", PROGRAM, "--resume", run, "--quiet"))
    assert "note: resuming" not in resumed.stderr, resumed.stderr
    assert step_of(run) == 12
    ok(mloc("run", PROGRAM, "--steps", 12, "--out", full, "--quiet"))
    assert same_state(run, full)
    recorded = config(run)["resumes"][0]
    assert recorded["steps"] == 12 and recorded["program"]["set"] == [failing] and recorded["changes"] == []


def test_a_resume_that_changes_a_set_shows_and_records_the_change(tmp_path, mloc_here):
    run = tmp_path / "run"
    ok(mloc_here("run", PROGRAM, "--steps", 6, "--set", UNROLL_3, "--set", "net.optimizer.lr=0.05", "--out", run,
            "--quiet"))
    resumed = ok(mloc_here("run", PROGRAM, "--steps", 8, "--resume", run, "--set", "weights->net.unroll=1",
                      "--set", "weights.optimizer.lr=0.02", "--quiet"))
    changes = [f"--set '{'weights->net.unroll=1'}' replaces the run's --set '{UNROLL_3}'",
               "--set 'weights.optimizer.lr=0.02' is added to the run's overrides"]
    assert f"note: resuming {run} with changes from its last start:\n" + \
        "".join(f"  {line}\n" for line in changes) in resumed.stderr, resumed.stderr
    recorded = config(run)["resumes"][0]
    assert recorded["changes"] == changes
    expect = ["net.optimizer.lr=0.05", "weights->net.unroll=1", "weights.optimizer.lr=0.02"]
    assert sorted(recorded["program"]["set"]) == expect and sorted(overrides_of(run)) == expect


def test_a_resume_with_another_seed_or_dtype_is_refused_before_compiling(tmp_path, mloc_here):
    """Exit 2 with the difference, config.json untouched; the refusal comes before the
    compile: the same command with a file that does not even parse is refused the same way."""
    run = tmp_path / "run"
    ok(mloc_here("run", PROGRAM, "--steps", 6, "--out", run, "--quiet"))
    before = (run / "config.json").read_text()
    broken = tmp_path / "broken.mlo"
    broken.write_text("program broken\nproblem {\n")
    for flags, said in ((("--seed", 3), "this command's seed is 3, the run's 0"),
                        (("--dtype", "float64"), "this command's dtype is float64, the run's none (as built)")):
        for file in (PROGRAM, broken):
            proc = mloc_here("run", file, "--steps", 8, "--resume", run, *flags, "--quiet")
            assert proc.returncode == 2, proc.stderr
            assert f"error: cannot resume {run} with another {flags[0][2:]}: {said}" in proc.stderr, proc.stderr
            assert "nothing was written" in proc.stderr and f"resume without {flags[0]}" in proc.stderr
    assert (run / "config.json").read_text() == before and step_of(run) == 6


@pytest.mark.slow
def test_a_resume_with_a_seed_set_in_the_train_block_is_refused(tmp_path):
    run = tmp_path / "run"
    ok(mloc("run", PROGRAM, "--steps", 6, "--out", run, "--quiet"))
    proc = mloc("run", PROGRAM, "--steps", 8, "--resume", run, "--set", "train.seed=4", "--quiet")
    assert proc.returncode == 2 and "this command's seed is 4, the run's 0" in proc.stderr, proc.stderr
    assert step_of(run) == 6


def python(train, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(train), *map(str, argv)], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=300)


@pytest.mark.slow
def test_train_py_resumes_with_the_runs_options_and_refuses_other_overrides(tmp_path):
    """The run's own train.py (compiled with its --set) continues it bitwise; a train.py
    compiled without the run's --set is refused with both lists, nothing written."""
    run, full, plain = tmp_path / "run", tmp_path / "full", tmp_path / "plain"
    ok(mloc("run", PROGRAM, "--steps", 6, "--set", UNROLL_3, "--out", run, "--quiet"))
    ok(mloc("compile", PROGRAM, "-o", plain))
    before = (run / "config.json").read_text()
    refused = python(plain / "train.py", "--steps", 8, "--resume", run, "--quiet")
    assert refused.returncode == 2, refused.stderr
    assert f"the run in {run} was last started with --set '{UNROLL_3}', and this train.py was compiled with " \
           "no --set" in refused.stderr and f"python {run / 'train.py'} --resume {run}" in refused.stderr
    assert (run / "config.json").read_text() == before and step_of(run) == 6
    ok(python(run / "train.py", "--steps", 8, "--resume", run, "--quiet"))
    ok(mloc("run", PROGRAM, "--steps", 8, "--set", UNROLL_3, "--out", full, "--quiet"))
    assert same_state(run, full)
    seeded = python(run / "train.py", "--steps", 10, "--resume", run, "--seed", 1, "--quiet")
    assert seeded.returncode == 2 and "this command's seed is 1, the run's 0" in seeded.stderr, seeded.stderr
    assert step_of(run) == 8
