"""`mloc run`: the examples train; NaN stops a run cleanly; checkpoints resume bitwise;
bad checkpoints are clear errors; bf16 trains."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mloc.cli import main
from mloc.runtime.program.checkpoint import load_checkpoint
from tests.conftest import PROGRAMS, ROOT

SMALL = Path(__file__).parent / "run" / "small.mlo"


def mloc(*argv, timeout=300, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mloc", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout, **kw)


def params(run_dir: Path) -> dict:
    state = load_checkpoint(run_dir / "checkpoint.pt", None)
    return {f"{n}.{i}": t for n, p in state["problems"].items() for i, t in enumerate(p["params"])} | \
           {f"{n}.module.{k}": t for n, p in state["problems"].items() for k, t in p["module"].items()}


@pytest.mark.parametrize("program,steps", [("data_reweighting", 3), ("maml", 3), ("hpo", 2), ("trilevel", 3)])
def test_examples_train(program, steps, tmp_path):
    rc = main(["run", str(PROGRAMS / f"{program}.mlo"), "--steps", str(steps), "--out", str(tmp_path),
               "--quiet", "--device", "cpu", "--precision", "fp32"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses and all(isinstance(v, float) for v in losses)
    assert load_checkpoint(tmp_path / "checkpoint.pt", None)["step"] == steps
    assert (tmp_path / "train.py").is_file() and (tmp_path / "plan.json").is_file()


def test_generated_train_py_runs_standalone_and_matches_mloc_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert mloc("run", str(SMALL), "--steps", "6", "--out", str(a), "--quiet").returncode == 0
    proc = subprocess.run([sys.executable, str(a / "train.py"), "--steps", "6", "--out", str(b), "--quiet"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_nan_stops_with_the_problem_and_step_and_keeps_the_last_good_checkpoint(tmp_path):
    proc = mloc("run", str(SMALL), "--out", str(tmp_path), "--quiet",
                "--set", "weights.loss=lib.ce_nan_after(net, batch, after=12)")
    assert proc.returncode == 1
    m = re.search(r"the hypergradient of problem `weights` became NaN or Inf at step (\d+)", proc.stderr)
    assert m, proc.stderr
    bad = int(m.group(1))
    assert 8 <= bad <= 13 and "Traceback" not in proc.stderr
    # checkpoints every 5 steps, written only after the finiteness check: the last good one
    assert load_checkpoint(tmp_path / "checkpoint.pt", None)["step"] == 5 * ((bad - 1) // 5)
    assert all(torch.isfinite(t).all() for t in params(tmp_path).values() if t.is_floating_point())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("option", [("--precision", "fp16"), ("--device", "cuda"), ("--device", "cuda:3")])
def test_a_device_or_precision_this_machine_lacks_is_a_usage_error(tmp_path, option, mloc_here):
    """Not a bug in mloc (exit 101): exit 2, one line naming what is missing, a help line."""
    proc = mloc_here("run", str(SMALL), "--steps", "2", "--out", str(tmp_path), "--quiet", *option)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "= help: use " in proc.stderr
    assert "Traceback" not in proc.stderr and "E900" not in proc.stderr


def test_corrupt_or_truncated_checkpoint_is_a_clear_error(tmp_path, mloc_here):
    assert mloc_here("run", str(SMALL), "--steps", "5", "--out", str(tmp_path), "--quiet").returncode == 0
    ckpt = tmp_path / "checkpoint.pt"
    data = ckpt.read_bytes()
    for broken in (data[: len(data) // 2], b"\x00garbage" * 10):
        ckpt.write_bytes(broken)
        proc = mloc_here("run", str(SMALL), "--steps", "10", "--out", str(tmp_path), "--resume", str(tmp_path), "--quiet")
        assert proc.returncode == 2, proc.stderr
        assert "checkpoint.pt" in proc.stderr and "help:" in proc.stderr and "Traceback" not in proc.stderr
        assert ckpt.read_bytes() == broken         # the user's file is left as it was


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    steps = ("--steps", "300")     # a wide window to kill in, however fast a step is
    assert mloc("run", str(SMALL), *steps, "--out", str(full), "--quiet").returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mloc", "run", str(SMALL), *steps, "--out", str(killed), "--quiet"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (killed / "checkpoint.pt").exists() and load_checkpoint(killed / "checkpoint.pt", None)["step"] >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = load_checkpoint(killed / "checkpoint.pt", None)["step"]
    assert 10 <= step < 300, step
    assert mloc("run", str(SMALL), *steps, "--out", str(killed), "--resume", str(killed), "--quiet").returncode == 0
    a, b = params(full), params(killed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_run_completes_with_decreasing_loss(tmp_path, mloc_here):
    proc = mloc_here("run", str(SMALL), "--steps", "60", "--precision", "bf16", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    net = [r["loss"] for r in records if r.get("problem") == "net"]
    assert len(net) >= 6
    assert sum(net[-3:]) / 3 < sum(net[:3]) / 3


@pytest.mark.slow
@pytest.mark.parametrize("method", ["neumann(iters=3, alpha=0.1)", "finite_diff(eps=0.01)", "sama(eps=0.01)"])
def test_two_gloo_processes_equal_one_process_with_the_combined_batch(tmp_path, method):
    def run(out, nproc, batch):
        sets = ["--set", f"net.data=lib.data(seed=0, batch_size={batch}, shuffle=false)",
                "--set", f"weights.data=lib.data(seed=10, batch_size={batch}, shuffle=false)",
                "--set", f"weights->net.hypergrad={method}"]
        proc = mloc("run", str(SMALL), "--steps", "10", "--out", str(out), "--quiet", "--nproc", str(nproc), *sets)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return params(out)

    one, two = run(tmp_path / "one", 1, 16), run(tmp_path / "two", 2, 8)
    assert one.keys() == two.keys()
    for k in one:
        if one[k].is_floating_point():
            err = float((one[k] - two[k]).abs().max() / one[k].abs().max().clamp_min(1e-12))
            assert err <= 1e-5, (k, err)


def test_an_error_in_the_programs_code_during_training_points_at_it(tmp_path):
    proc = mloc("run", str(SMALL), "--out", str(tmp_path), "--quiet",
                "--set", "weights.loss=lib.ce_raising_after(net, batch, after=12)")
    assert proc.returncode == 1, proc.stderr
    assert "error[E702]: the program's code raised ValueError during step" in proc.stderr
    assert "small.py" in proc.stderr and "labels out of range" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_new_run_never_overwrites_an_earlier_one_unasked(tmp_path, mloc_here):
    assert mloc_here("run", str(SMALL), "--steps", "5", "--out", str(tmp_path), "--quiet").returncode == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()
    proc = mloc_here("run", str(SMALL), "--steps", "7", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 2 and "already holds a run" in proc.stderr and "--resume" in proc.stderr
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    assert mloc_here("run", str(SMALL), "--steps", "7", "--out", str(tmp_path), "--quiet", "--overwrite").returncode == 0
    assert load_checkpoint(tmp_path / "checkpoint.pt", None)["step"] == 7


def test_a_run_reports_its_evaluations_and_what_it_wrote(tmp_path, mloc_here):
    """Without --quiet (and without a terminal: plain lines): progress at each log interval,
    each evaluation as it happens, and a closing line naming the files written."""
    proc = mloc_here("run", str(SMALL), "--steps", "20", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert any(re.fullmatch(r"small_reweighting step 20/20  net [\d.]+  weights [\d.]+  [\d.]+ steps/s", x)
               for x in lines), lines
    assert any(re.fullmatch(r"small_reweighting step 10: accuracy = [\d.]+", x)
               for x in lines), lines
    assert lines[-1] == (f"done: 20 steps in {lines[-1].split(' in ')[1].split(' s;')[0]} s; wrote "
                         f"{tmp_path / 'checkpoint.pt'} and {tmp_path / 'metrics.jsonl'}")
    quiet = mloc_here("run", str(SMALL), "--steps", "20", "--out", str(tmp_path / "q"), "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_run_options_reach_train_py_unchanged():
    """`mloc run --nproc` hands its options to train.py as arguments: they parse back to the
    same options, and to the same config as `mloc run` builds in process."""
    import argparse

    from mloc.runtime.files.options import RunConfig, RunOptions, add_flags

    defaults = RunConfig(steps=7, seed=3, device="auto", precision="fp32")
    parser = argparse.ArgumentParser()
    add_flags(parser, defaults)
    for options in (RunOptions(), RunOptions(steps=2, seed=5, device="cpu", precision="bf16", dtype="float64",
                                             out=Path("runs/x"), resume=Path("runs/y"), quiet=True, threads=2,
                                             logger=("csv",))):
        parsed = RunOptions.parsed(parser.parse_args(options.argv()))
        assert parsed == options
        assert parsed.config(defaults) == options.config(defaults)
    assert RunOptions().config(defaults) == defaults
    assert RunOptions(steps=2).config(defaults).steps == 2
