"""A `torch.optim.lr_scheduler` drives everything it changes in the param group, not only
the learning rate (docs/language.md, "Built-in schedules").

OneCycleLR and CyclicLR cycle the momentum by default (``cycle_momentum=True``): beta1 of
an optimizer with ``betas`` (Adam, NAdam), else its ``momentum`` (SGD), inversely to the
rate. Each case runs `mloc run` end to end in float64 on tests/torch_optim/quad.mlo (the
lower problem's optimizer and schedule set with ``--set``) and compares the parameters of
its checkpoint with a hand-written loop: ``torch.optim`` optimizer, the same torch
scheduler, ``scheduler.step()`` after each ``optimizer.step()``
(`tests.test_torch_optim.hand`). The tolerance, 1e-12 relative: a built-in optimizer with a
scheduled hyperparameter takes its functional path (the rates and betas are 0-dim float64
tensors, `mloc/runtime/optim/base.py`), which rounds differently from ``torch.optim``'s
in-place formulas in the last bits of each of the 12 lower steps; a momentum left
uncycled is 1e-3 to 1e-2 away. A ``torch.optim`` optimizer gets the scheduler's values
written into its own param group: bit for bit.

What torch itself refuses (a momentum-cycling scheduler on an optimizer with neither
``momentum`` nor ``betas``) and what no step count can drive (a scheduler whose ``step``
reads a metric) are diagnostics at the schedule, exit 1, with the fix.
"""

from __future__ import annotations

import pytest
import torch

from mloc.cli import main
from tests.test_run import params
from tests.test_torch_optim import QUAD, hand, radam

LRS = "torch.optim.lr_scheduler"
OUTER = 4                               # 4 outer steps × unroll 3: 12 lower steps


def run(tmp_path, *sets: str) -> tuple[torch.Tensor, torch.Tensor]:
    argv = ["run", str(QUAD), "--steps", str(OUTER), "--dtype", "float64", "--out", str(tmp_path),
            "--quiet", "--device", "cpu"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    p = params(tmp_path)
    return p["model.0"], p["hyper.0"]


def close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    return bool(((a - b).abs() <= rtol * b.abs()).all())


CASES = {
    # mloc optimizer, the torch.optim optimizer it is, the scheduler (mloc spelling, torch call)
    "adam-onecycle": ("adam(lr=0.01)", lambda ps: torch.optim.Adam(ps, lr=0.01),
                      f"{LRS}.OneCycleLR(max_lr=0.2, total_steps=12)",
                      lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12)),
    "adamw-onecycle": ("adamw(lr=0.01, weight_decay=0.1)",
                       lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
                       f"{LRS}.OneCycleLR(max_lr=0.2, total_steps=20, anneal_strategy=\"linear\")",
                       lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=20,
                                                                     anneal_strategy="linear")),
    "sgd-onecycle": ("sgd(lr=0.01, momentum=0.9)", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
                     f"{LRS}.OneCycleLR(max_lr=0.2, total_steps=12)",
                     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12)),
    "sgd-cyclic": ("sgd(lr=0.01, momentum=0.9)", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
                   f"{LRS}.CyclicLR(base_lr=0.01, max_lr=0.2, step_size_up=3)",
                   lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=3)),
    "adam-cyclic": ("adam(lr=0.01)", lambda ps: torch.optim.Adam(ps, lr=0.01),
                    f"{LRS}.CyclicLR(base_lr=0.01, max_lr=0.2, step_size_up=3)",
                    lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=3)),
    # torch.optim.SGD without momentum: torch's CyclicLR turns it on (0.9 → 0.8 → 0.9); so does mloc
    "sgd0-cyclic": ("sgd(lr=0.01)", lambda ps: torch.optim.SGD(ps, lr=0.01),
                    f"{LRS}.CyclicLR(base_lr=0.01, max_lr=0.2, step_size_up=3)",
                    lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_builtin_optimizer_follows_the_schedulers_momentum(case, tmp_path):
    opt, torch_opt, sched, torch_sched = CASES[case]
    w, h = run(tmp_path, f"model.optimizer={opt}", f"model.schedule={sched}")
    rw, rh = hand(OUTER, torch_opt, radam(0.02), low_sched=torch_sched)
    assert close(w, rw, 1e-12) and close(h, rh, 1e-12), (w - rw, h - rh)


@pytest.mark.parametrize("opt,torch_opt", [
    ("torch.optim.NAdam(lr=0.01)", lambda ps: torch.optim.NAdam(ps, lr=0.01)),
    ("torch.optim.SGD(lr=0.01, momentum=0.5, nesterov=true)",
     lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.5, nesterov=True)),
])
def test_a_torch_optimizer_follows_the_schedulers_momentum_bit_for_bit(opt, torch_opt, tmp_path):
    w, h = run(tmp_path, f"model.optimizer={opt}", f"model.schedule={LRS}.OneCycleLR(max_lr=0.0625, total_steps=12)")
    rw, rh = hand(OUTER, torch_opt, radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.0625, total_steps=12))
    assert torch.equal(w, rw) and torch.equal(h, rh), (w - rw, h - rh)


def test_cycling_a_momentum_declared_zero_is_a_warning(tmp_path, capsys):
    """sgd without momentum under CyclicLR's defaults trains with momentum 0.8–0.9 (the case
    sgd0-cyclic above matches torch's loop so): W107 says so, with the way out."""
    run(tmp_path, "model.optimizer=sgd(lr=0.01)", f"model.schedule={LRS}.CyclicLR(base_lr=0.01, max_lr=0.2)")
    err = capsys.readouterr().err
    assert "warning[W107]" in err and "0.8–0.9" in err and "cycle_momentum=false" in err
    run(tmp_path / "plain", "model.optimizer=sgd(lr=0.01, momentum=0.5)",
        f"model.schedule={LRS}.CyclicLR(base_lr=0.01, max_lr=0.2)")
    assert "W107" not in capsys.readouterr().err


def test_without_cycle_momentum_only_the_rate_changes(tmp_path):
    w, h = run(tmp_path, "model.optimizer=adam(lr=0.01, betas=(0.8, 0.99))",
               f"model.schedule={LRS}.OneCycleLR(max_lr=0.2, total_steps=12, cycle_momentum=false)")
    rw, rh = hand(OUTER, lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99)), radam(0.02),
                  low_sched=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12,
                                                                          cycle_momentum=False))
    assert close(w, rw, 1e-12) and close(h, rh, 1e-12)


def test_an_uncycled_momentum_would_be_far_off(tmp_path):
    """The reference this file checks against is not insensitive to the momentum: the same
    schedule with the momentum left at the optimizer's own value is 1e-3 away or more."""
    w, _ = run(tmp_path, "model.optimizer=adam(lr=0.01)", f"model.schedule={LRS}.OneCycleLR(max_lr=0.2, total_steps=12)")
    stale, _ = hand(OUTER, lambda ps: torch.optim.Adam(ps, lr=0.01), radam(0.02),
                    low_sched=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12,
                                                                            cycle_momentum=False))
    assert not close(w, stale, 1e-3)


def _refused(tmp_path, capsys, *sets: str) -> str:
    argv = ["run", str(QUAD), "--steps", "2", "--out", str(tmp_path / "r"), "--quiet", "--device", "cpu"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 1
    return capsys.readouterr().err


def test_cycling_the_momentum_of_an_optimizer_without_one_is_a_diagnostic(tmp_path, capsys):
    """torch raises for Adagrad (neither `momentum` nor `betas`); mloc says so at the
    schedule's line in the file, with the fix, before training."""
    text = QUAD.read_text().replace("    optimizer = torch.optim.RAdam(lr=0.05, betas=(0.8, 0.99))\n",
                                    "    optimizer = torch.optim.Adagrad(lr=0.1)\n"
                                    f"    schedule  = {LRS}.CyclicLR(base_lr=0.01, max_lr=0.1)\n")
    (tmp_path / "quad.py").write_text((QUAD.parent / "quad.py").read_text())
    (tmp_path / "cyclic.mlo").write_text(text)
    assert main(["run", str(tmp_path / "cyclic.mlo"), "--steps", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error[E710]" in err and "CyclicLR" in err and "Adagrad" in err
    assert "cyclic.mlo:13:" in err                             # the schedule's line
    assert "cycle_momentum=false" in err                      # the fix
    assert "E900" not in err and not (tmp_path / "r" / "checkpoint.pt").exists()
    # and the fix works
    assert main(["run", str(tmp_path / "cyclic.mlo"), "--steps", "2", "--out", str(tmp_path / "f"), "--quiet",
                 "--set", "model.schedule.cycle_momentum=false"]) == 0


def test_a_scheduler_that_reads_a_metric_is_a_diagnostic(tmp_path, capsys):
    err = _refused(tmp_path, capsys, f"model.schedule={LRS}.ReduceLROnPlateau()")
    assert "error[E710]" in err and "ReduceLROnPlateau" in err and "metrics" in err
    assert "E900" not in err


def test_a_schedulers_bad_argument_is_a_diagnostic(tmp_path, capsys):
    err = _refused(tmp_path, capsys, f"model.schedule={LRS}.StepLR(step_size=2, bogus=1)")
    assert "error[E710]" in err and "StepLR" in err and "bogus" in err and "E900" not in err


def test_a_schedule_that_ends_before_the_run_is_a_diagnostic(tmp_path, capsys):
    """OneCycleLR over 4 steps, a run of 6 lower steps: torch raises at the 5th
    ``scheduler.step()``; mloc says which step and what to change, exit 1."""
    err = _refused(tmp_path, capsys, f"model.schedule={LRS}.OneCycleLR(max_lr=0.1, total_steps=4)")
    assert "error[E710]" in err and "total_steps" in err and "E900" not in err


def test_a_setting_the_optimizer_cannot_take_is_a_diagnostic(tmp_path, capsys):
    """A scheduler of the user's that sets shampoo's `epsilon` (its ridge, not a tensor
    hyperparameter) when it is built: refused at the schedule before training, not ignored."""
    err = _refused(tmp_path, capsys, "model.optimizer=shampoo(lr=0.01)", "model.schedule=quad.sets_at_build()")
    assert "error[E710]" in err and "`epsilon`" in err and "cannot apply" in err and "E900" not in err


def test_a_setting_changed_only_later_is_a_diagnostic_at_that_step(tmp_path, capsys):
    """A scheduler that starts changing sgd's `weight_decay` at its 3rd step: nothing was
    prepared to apply it, so the run stops there (E710, exit 1) instead of dropping it. The
    same scheduler on a torch.optim optimizer is applied as written (bit for bit)."""
    err = _refused(tmp_path, capsys, "model.optimizer=sgd(lr=0.01)", "model.schedule=quad.changes_later(at=2)")
    assert "error[E710]" in err and "`weight_decay`" in err and "step 3" in err and "E900" not in err
    import importlib.util
    spec = importlib.util.spec_from_file_location("quad_ref2", QUAD.parent / "quad.py")
    quad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quad)
    w, h = run(tmp_path / "t", "model.optimizer=torch.optim.SGD(lr=0.0625)", "model.schedule=quad.changes_later(at=2)")
    rw, rh = hand(OUTER, lambda ps: torch.optim.SGD(ps, lr=0.0625), radam(0.02),
                  low_sched=lambda o: quad.changes_later(o, at=2))
    assert torch.equal(w, rw) and torch.equal(h, rh)


def test_a_cycled_momentum_resumes_from_a_checkpoint(tmp_path):
    """The driven values follow the problem's step count: a run resumed from a checkpoint at
    outer step 2 ends where the uninterrupted one does, bit for bit."""
    sets = ["model.optimizer=adam(lr=0.01)", f"model.schedule={LRS}.OneCycleLR(max_lr=0.2, total_steps=12)"]
    whole, _ = run(tmp_path / "whole", *sets)
    argv = ["run", str(QUAD), "--dtype", "float64", "--quiet", "--device", "cpu"]
    for s in sets:
        argv += ["--set", s]
    assert main([*argv, "--steps", "2", "--out", str(tmp_path / "part")]) == 0
    assert main([*argv, "--steps", str(OUTER), "--resume", str(tmp_path / "part")]) == 0
    assert torch.equal(params(tmp_path / "part")["model.0"], whole)
