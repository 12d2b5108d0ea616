"""The metrics schema (docs/runtime.md, "Metrics"): every record has kind, step and time;
train records carry the interval's mean loss (no host sync per step), the learning rate
and the gradient or hypergradient norm; the loggers beside metrics.jsonl write the same
values (read back with csv and with TensorBoard's own event reader)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import types
from pathlib import Path

import pytest
import torch

import mloc
from mloc.cli import main
from mloc.runtime.files.loggers import LoggerError, WandbLogger, check_available, parse, scalars
from mloc.runtime.grad.finite import FiniteGuard
from mloc.runtime.run.records import read_metrics

SMALL = Path(__file__).resolve().parents[1] / "run" / "small.mlo"     # net (lower), weights (upper), log every 5


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_guard_means_are_the_exact_interval_means_without_a_host_read(monkeypatch):
    g = torch.Generator().manual_seed(0)
    losses = [torch.rand((), generator=g, dtype=torch.float64) * 10 for _ in range(23)]
    guard = FiniteGuard()
    keep = guard.loss_watcher("p")
    for name in ("item", "tolist", "__float__"):                   # watching must not read
        monkeypatch.setattr(torch.Tensor, name, lambda *a, **k: pytest.fail("host read during a watch"))
    for step, loss in enumerate(losses[:10], 1):
        keep(step, loss)
    monkeypatch.undo()
    guard.check()
    (mean, n), = guard.means().values()
    assert n == 10 and mean == pytest.approx(math.fsum(float(x) for x in losses[:10]) / 10, rel=1e-15, abs=0)
    for step, loss in enumerate(losses[10:], 11):                  # the next interval starts afresh
        keep(step, loss)
    guard.check()
    assert guard.means()[("p", "loss")] == (pytest.approx(math.fsum(float(x) for x in losses[10:]) / 13,
                                                          rel=1e-15, abs=0), 13)
    assert guard.means() == {}


def test_guard_means_survive_a_fold():
    guard = FiniteGuard(capacity=4)                                # folds (reads) every 4 watches
    keep = guard.loss_watcher("p")
    values = [float(v) for v in range(1, 12)]
    for step, v in enumerate(values, 1):
        keep(step, torch.tensor(v, dtype=torch.float64))
    guard.check()
    assert guard.means() == {("p", "loss"): (sum(values) / len(values), len(values))}


def test_norms_are_sampled_only_on_logged_steps_and_equal_the_flat_norm():
    guard = FiniteGuard()
    keep = guard.norms.watcher("p", "grad_norm")
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
    keep(grads)
    assert guard.norms.read() == {}                                     # not sampling: nothing queued
    guard.norms.sampling = True
    keep([2 * x for x in grads])
    keep(grads)                                                    # the last one of the step is kept
    flat = torch.cat([x.reshape(-1) for x in grads])
    (norm,) = guard.norms.read().values()
    assert norm == pytest.approx(math.sqrt(math.fsum(float(v) ** 2 for v in flat)), rel=1e-14, abs=0)
    keep([torch.full((2,), float("inf"), dtype=torch.float64)])
    assert guard.norms.read() == {("p", "grad_norm"): None}            # logged as null, not raised


def _run(tmp_path, *extra):
    return main(["run", str(SMALL), "--steps", "10", "--out", str(tmp_path), "--threads", "1", *extra])


def test_train_records_hold_the_mean_loss_lr_and_norms(tmp_path, capsys):
    assert _run(tmp_path, "--logger", "csv") == 0
    err = capsys.readouterr().err
    assert "training small_reweighting on cpu, precision fp32, dtype as built, 1 thread, nproc 1, compile auto ->" in err
    records = read_metrics(tmp_path / "metrics.jsonl")
    raw = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all({"kind", "step", "time"} <= r.keys() for r in raw)
    assert [r["kind"] for r in raw] == ["train", "train", "speed", "train", "train", "speed", "eval", "summary"]
    assert json.loads((tmp_path / "config.json").read_text())["run"]["threads"] == 1
    net = [r for r in records if r["kind"] == "train" and r["problem"] == "net"]
    weights = [r for r in records if r["kind"] == "train" and r["problem"] == "weights"]
    assert [r["step"] for r in net] == [5, 10] and all(r["lr"] == 0.1 for r in net)
    assert all("grad_norm" in r and r["grad_norm"] > 0 for r in net)
    assert all("hypergrad_norm" in r and r["hypergrad_norm"] > 0 for r in weights)
    assert [r["loss_steps"] for r in net] == [10, 10]                  # unroll = 2: two steps per outer step
    # CSV: the same scalars, one row each
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    expect = [(r["step"], k, v) for r in records for k, v in scalars(r).items()]
    assert [(int(r["step"]), r["name"], float(r["value"])) for r in rows] == expect


def test_the_mean_loss_is_the_mean_of_the_steps_losses(tmp_path):
    """`net` steps twice per outer step (unroll 2): the record at step 5 averages the 10
    losses of its steps 1..5, each as the step computed it (the same float32 values, read
    into Python floats and summed: equal up to the order of the additions)."""
    assert _run(tmp_path, "--quiet") == 0
    record = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train" and r["problem"] == "net")
    s = mloc.load(SMALL)
    seen = []
    keep = s.program.guard.loss_watcher

    def spy(problem, what="loss"):
        inner = keep(problem, what)

        def watch(step, loss):
            if problem == "net":
                seen.append(float(loss))
            return inner(step, loss)
        return watch
    s.program.guard.loss_watcher = spy
    for _ in range(5):
        s.step()
    assert len(seen) == 10
    assert record["loss"] == pytest.approx(math.fsum(seen) / 10, rel=1e-13, abs=0)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_events_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert _run(tmp_path, "--quiet", "--logger", "tensorboard,csv") == 0
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    records = read_metrics(tmp_path / "metrics.jsonl")
    expect = {}
    for r in records:
        for name, value in scalars(r).items():
            expect.setdefault(name, []).append((r["step"], value))
    assert set(acc.Tags()["scalars"]) == set(expect)
    for name, points in expect.items():
        got = [(e.step, e.value) for e in acc.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in points]
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got, points))   # float32 in events


def test_logger_names_and_missing_extras(tmp_path, capsys, monkeypatch):
    assert parse(["csv,tensorboard", "csv"]) == ("csv", "tensorboard")
    with pytest.raises(LoggerError, match="unknown logger `mlflow`"):
        parse(["mlflow"])
    assert main(["run", str(SMALL), "--out", str(tmp_path), "--logger", "mlflow"]) == 2
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(LoggerError) as e:
        check_available(["wandb"])
    assert "pip install 'mloc[wandb]'" in e.value.help
    capsys.readouterr()
    assert main(["run", str(SMALL), "--out", str(tmp_path), "--logger", "wandb"]) == 2
    err = capsys.readouterr().err
    assert "--logger wandb needs the `wandb` package" in err and "pip install 'mloc[wandb]'" in err
    assert not (tmp_path / "metrics.jsonl").exists()             # refused before anything ran


def test_wandb_logger_with_a_fake_module(tmp_path):
    calls = []

    class FakeRun:
        summary = {}

        def log(self, values, step):
            calls.append(("log", step, values))

        def finish(self):
            calls.append(("finish",))

    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or FakeRun())
    logger = WandbLogger(tmp_path / "runs" / "7", {"steps": 10}, module=fake)
    logger.log({"kind": "train", "step": 5, "time": 1.0, "problem": "net", "loss": 0.5, "lr": 0.1, "loss_steps": 5})
    logger.log({"kind": "eval", "step": 10, "time": 2.0, "problem": "*", "eval": "acc", "value": 0.9})
    logger.log({"kind": "summary", "step": 10, "time": 3.0, "problem": "*", "final": {"acc": 0.9}})
    logger.close()
    assert calls[0][0] == "init" and calls[0][1]["name"] == "runs/7" and calls[0][1]["config"] == {"steps": 10}
    assert calls[1:] == [("log", 5, {"net/loss": 0.5, "net/lr": 0.1}), ("log", 10, {"eval/acc": 0.9}), ("finish",)]
    assert FakeRun.summary == {"acc": 0.9}


@pytest.mark.slow
def test_nproc_logs_on_rank_0_only_and_shows_its_progress(tmp_path):
    """--nproc 2: one record per (kind, step, problem, eval) in metrics.jsonl and one CSV row
    per scalar (rank 0 alone writes), and the launcher shows rank 0's banner, progress and
    closing summary (~100 s on the loaded 2-core machine: slow tier)."""
    import os
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(SMALL), "--steps", "10", "--nproc", "2",
                           "--threads", "1", "--logger", "csv", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert ", 1 thread, nproc 2 (strategy ddp: auto: parameters, gradients and optimizer state (1.0 KiB) fit " \
        "easily (<= 1.0 GiB) on every rank), compile auto ->" in proc.stderr and "step 10/10" in proc.stderr and "done: 10 steps" in proc.stderr
    records = read_metrics(tmp_path / "metrics.jsonl")
    keys = [(r["kind"], r["step"], r["problem"], r.get("eval")) for r in records]
    assert len(keys) == len(set(keys)) and {k[0] for k in keys} == {"train", "speed", "eval", "summary"}
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(len(scalars(r)) for r in records)


def test_speed_records_carry_the_cuda_allocators_peak_and_nothing_on_the_cpu(monkeypatch):
    import torch
    from mloc.runtime.files.loggers import scalars
    from mloc.runtime.run.records import device_memory
    assert device_memory(torch.device("cpu")) == {}
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: asked.append(d) or 3 * 2**20)
    assert device_memory(torch.device("cuda", 1)) == {"peak_mib": 3.0} and asked == [torch.device("cuda", 1)]
    record = {"kind": "speed", "step": 5, "problem": "*", "steps_per_s": 2.5, "peak_mib": 3.0}
    assert scalars(record) == {"speed/steps_per_s": 2.5, "speed/peak_mib": 3.0}
    assert scalars({"kind": "speed", "step": 5, "steps_per_s": 2.5}) == {"speed/steps_per_s": 2.5}
