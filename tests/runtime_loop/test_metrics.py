"""MetricsWriter and FiniteGuard."""

from __future__ import annotations

import json

import pytest
import torch

from mloc.runtime.grad.finite import FiniteGuard, NonFiniteError
from mloc.runtime.run.metrics import MetricsWriter


def test_writes_one_flushed_json_object_per_line(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    w = MetricsWriter(path, clock=lambda: 12.5)
    w.write(10, "classifier", loss=torch.tensor(0.5), lr=0.1)
    assert json.loads(path.read_text()) == {"kind": "train", "step": 10, "time": 12.5, "problem": "classifier",
                                            "loss": 0.5, "lr": 0.1}
    w.write(20, "weight_net", loss=float("nan"), grads=torch.tensor([1.0, float("inf")]))
    w.close()
    with MetricsWriter(path, clock=lambda: 13.0) as again:  # appends
        again.write(30, "*", "eval", eval="acc", value=1)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[1] == {"kind": "train", "step": 20, "time": 12.5, "problem": "weight_net", "loss": None,
                        "grads": [1.0, None]}
    assert lines[2] == {"kind": "eval", "step": 30, "time": 13.0, "problem": "*", "eval": "acc", "value": 1}
    assert [r["step"] for r in lines] == [10, 20, 30]


def test_only_the_main_process_writes(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl", enabled=False)
    w.write(1, "p", loss=1.0)
    w.close()
    assert not (tmp_path / "m.jsonl").exists()


@pytest.fixture
def no_host_reads(monkeypatch):
    """Make every tensor-to-host read fail (for the duration of a block)."""
    def forbid():
        def fail(*a, **k):
            raise AssertionError("host sync in watch")
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, fail)
    return forbid


def test_reports_the_first_bad_step_and_problem(monkeypatch, no_host_reads):
    guard = FiniteGuard()
    nan, inf = float("nan"), float("inf")
    losses = {"upper": [1.0, 2.0, 3.0, nan, 5.0], "lower": [1.0, 2.0, inf, nan, 1.0]}
    values = {k: torch.tensor(v) for k, v in losses.items()}
    w = torch.zeros(3)
    no_host_reads()
    for step in range(5):
        guard.watch(step, "lower", values["lower"][step])
        guard.watch(step, "lower", (w, None), what="gradient")
        guard.watch(torch.tensor(step), "upper", values["upper"][step])
    monkeypatch.undo()
    with pytest.raises(NonFiniteError) as info:
        guard.check()
    err = info.value
    assert (err.problem, err.step, err.what) == ("lower", 2, "loss")
    assert str(err) == "the loss of problem `lower` became NaN or Inf at step 2" and err.help


def test_gradients_and_a_clean_run():
    guard = FiniteGuard()
    guard.check()                                           # nothing watched
    guard.watch(0, "p", (torch.ones(2), torch.ones(3)), what="gradient")
    guard.check()
    guard.watch(1, "p", (torch.ones(2), torch.tensor([0.0, -float("inf")])), what="gradient")
    with pytest.raises(NonFiniteError, match="the gradient of problem `p` became NaN or Inf at step 1"):
        guard.check()


def test_a_full_buffer_keeps_the_first_failure(monkeypatch, no_host_reads):
    """More watches than the buffer holds between checks: the first failure, from an
    earlier fill of the buffer, is still the one reported; watches never read the device
    until the buffer is full."""
    guard = FiniteGuard(capacity=5)
    nan = float("nan")
    no_host_reads()
    for step in range(1, 4):                                # 3 values + 2 gradient norms: fits
        guard.watch(step, "a", torch.tensor(nan if step == 3 else 1.0))
    guard.watch(3, "b", (torch.ones(2), torch.tensor([nan])), what="gradient")
    monkeypatch.undo()
    for step in range(4, 30):                               # folds several times
        guard.watch(step, "a", torch.tensor(float("inf") if step in (7, 20) else 1.0))
        guard.watch(step, "b", (torch.ones(2), torch.ones(3)), what="gradient")
    for _ in range(2):                                      # and keeps raising it
        with pytest.raises(NonFiniteError) as info:
            guard.check()
        assert (info.value.problem, info.value.step, info.value.what) == ("a", 3, "loss")


def test_integer_tensors_and_non_scalar_losses():
    guard = FiniteGuard()
    guard.watch(1, "p", torch.arange(3))
    guard.watch(1, "p", (torch.arange(3), torch.ones(2, dtype=torch.bfloat16)), what="gradient")
    guard.watch(2, "p", torch.tensor([1.0, 2.0]))
    guard.check()
    guard.watch(3, "p", (torch.ones(2, dtype=torch.float16), torch.tensor([-float("inf")])), what="gradient")
    guard.watch(4, "p", torch.tensor([1.0, float("nan")]))
    with pytest.raises(NonFiniteError, match="the gradient of problem `p` became NaN or Inf at step 3"):
        guard.check()


def test_finite_values_too_large_for_float32_are_finite():
    guard = FiniteGuard()
    guard.watch(1, "p", torch.tensor(1e300, dtype=torch.float64))
    guard.watch(1, "p", (torch.full((3,), 1e300, dtype=torch.float64), torch.ones(1)), what="gradient")
    guard.check()


def test_watching_gradients_changes_none_of_them():
    """The fused check runs with an unscale factor of exactly 1: values, dtypes and NaN/Inf
    entries are left as they were."""
    guard = FiniteGuard()
    grads = [torch.randn(5, 3), torch.tensor([1e-45, -0.0, 3.0e38]), torch.randn(4, dtype=torch.float64),
             torch.randn(2, dtype=torch.bfloat16), torch.tensor([float("nan"), float("inf"), 1.0])]
    kept = [g.clone() for g in grads]
    guard.watch(1, "p", grads[:4], what="gradient")
    guard.check()
    guard.watch(2, "p", grads, what="gradient")
    for g, k in zip(grads, kept):
        assert g.dtype == k.dtype and torch.equal(g.isnan(), k.isnan())
        assert torch.equal(torch.nan_to_num(g), torch.nan_to_num(k))
        assert torch.equal(torch.signbit(g), torch.signbit(k))
    with pytest.raises(NonFiniteError, match="at step 2"):
        guard.check()


def test_bound_watchers_report_like_watch(monkeypatch, no_host_reads):
    """`loss_watcher`/`grads_watcher` (what the engine binds once per problem) keep the same
    record as `watch`, read nothing from the device, and hand anything unusual (a
    non-scalar or grad-requiring loss, a tensor step, None entries) to `watch`."""
    guard = FiniteGuard(capacity=8)
    loss_of, grads_of = guard.loss_watcher("lower"), guard.grads_watcher("upper", "hypergradient")
    nan = float("nan")
    w = torch.ones(3)
    no_host_reads()
    grads_of(1, [w])            # no pool yet: through watch, which makes it
    loss_of(1, torch.tensor(1.0))
    loss_of(2, torch.tensor([1.0, 2.0]))                   # not 0-dim: watch reduces it
    loss_of(2, torch.tensor(1.0, requires_grad=True))       # requires grad: watch detaches it
    grads_of(torch.tensor(2), [w, None])                    # tensor step, None entry
    grads_of(3, [w, torch.tensor([0.0, nan])])
    loss_of(4, torch.tensor(nan))
    monkeypatch.undo()
    with pytest.raises(NonFiniteError) as info:
        guard.check()
    assert (info.value.problem, info.value.step, info.value.what) == ("upper", 3, "hypergradient")
    clean = FiniteGuard(capacity=8)
    loss_of, grads_of = clean.loss_watcher("lower"), clean.grads_watcher("upper", "hypergradient")
    for step in range(1, 20):                               # folds past the capacity, stays clean
        loss_of(step, torch.tensor(1.0))
        grads_of(step, [w])
    clean.check()
    grads_of(20, [torch.tensor([float("inf")])])
    with pytest.raises(NonFiniteError, match="at step 20"):
        clean.check()
