"""What a log boundary writes into ``metrics.jsonl`` (the ``train`` and ``speed`` records of
the schema in :mod:`mloc.runtime.run.metrics`), and reading the file back.

:func:`log_train` takes each problem's mean loss over the interval and its sampled
gradient norm from the :class:`~mloc.runtime.grad.finite.FiniteGuard` (which kept them on the
device: no host sync per step) and its learning rate from the problem; :func:`read_metrics`
is what `mloc plot`, `mloc runs` and `mloc sweep` read.
"""

from __future__ import annotations

import os
from typing import Any

from torch import Tensor

from mloc.runtime.run.metrics import MetricsWriter


def log_train(metrics: MetricsWriter, program: Any, step: int, rate: float) -> dict[str, float]:
    """Write the ``train`` records of ``program`` (an :class:`~mloc.runtime.program.engine.Program`)
    at ``step`` and a ``speed`` record; returns ``{problem: loss}`` for the progress display.
    Call right after ``program.guard.check()`` (which read the losses this takes the means
    of). The learning rates are read here (a scheduled one is a 0-dim tensor: one read per
    problem, at log boundaries only)."""
    guard = program.guard
    means, norms, current = guard.means(), guard.norms.read(), None
    sync = getattr(program, "sync", None)
    collectives = sync.take(step) if sync is not None and sync.world > 1 else {}
    losses = {}
    for name, lv in program.live.items():
        mean = means.get((name, "loss"))
        if mean is None:                  # no step reported a loss: the loss on its current batch
            current = program.losses() if current is None else current
            if name not in current:
                continue
            mean = (current[name], 0)
        losses[name] = mean[0]
        values = {"loss": mean[0], "loss_steps": mean[1]}
        lr = learning_rate(lv)
        if lr is not None:
            values["lr"] = lr
        for what in ("grad_norm", "hypergrad_norm"):
            if (name, what) in norms:
                values[what] = norms[(name, what)]
        values.update(optimizer_report(lv))
        if name in collectives:           # data parallelism: collectives per outer step
            values["collectives"] = collectives[name]
        reports = [r for (_, n), r in program.compiling.reports.items() if n == name]
        if reports:                       # a compiled step: its recompiles so far (0 in steady state)
            values["recompiles"] = sum(r.recompiles for r in reports)
        metrics.write(step, name, "train", **values)
    metrics.write(step, "*", "speed", steps_per_s=rate, **device_memory(getattr(program, "device", None)))
    return losses


def device_memory(device: Any) -> dict[str, float]:
    """``{"peak_mib": ...}``: the most memory the CUDA caching allocator has handed out on
    ``device`` since the process started (``torch.cuda.max_memory_allocated``, MiB), read
    only at a log interval (it syncs nothing); ``{}`` on any other device."""
    if getattr(device, "type", None) != "cuda":
        return {}
    import torch
    return {"peak_mib": torch.cuda.max_memory_allocated(device) / 2**20}


def optimizer_report(lv: Any) -> dict[str, float]:
    """What a problem's optimizer reports about itself (:meth:`~mloc.runtime.optim.base.Optimizer.report`:
    Shampoo's rejected roots); nothing for a problem without an optimizer or state yet."""
    problem = lv.problem
    optimizer = getattr(problem, "optimizer", None)
    if optimizer is None or getattr(problem, "state", None) is None:
        return {}
    return optimizer.report(problem.state)


def learning_rate(lv: Any) -> float | None:
    """A problem's learning rate now: its optimizer's rate (a number, or the 0-dim tensor
    its schedule rewrites before each step); None when its optimizer has none."""
    lr = getattr(getattr(lv.problem, "optimizer", None), "rate", None)
    if isinstance(lr, Tensor):
        return float(lr)
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` (a torn last line, from a killed run, skipped;
    one that is not what mloc writes an :class:`~mloc.runtime.files.runread.Unreadable`).
    Records from before the schema (no ``kind``) get one: ``eval`` when they hold ``eval``,
    ``speed`` for ``steps_per_s``, else ``train``."""
    from mloc.runtime.files import runread
    out = runread.metrics(path)
    for record in out:
        record.setdefault("kind", "eval" if "eval" in record else "speed" if "steps_per_s" in record else "train")
    return out
