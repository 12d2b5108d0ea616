"""programs/hpo.mlo (per-feature weight decay, Betty's ``logistic_regression_hpo`` rebuilt)
under Betty: two ImplicitProblems, the lower unrolled 50 steps (``unroll_steps=50``), the
upper clipped (``gradient_clipping=10``). mloc's ``cg(iters=30, tol=1e-10)`` is Betty's
``type="cg"``, ``cg_iterations=30`` (Betty has no tolerance). Betty 0.2.1's CG updates the
search direction from the old residual (``p_new = r + β p`` with ``r`` not ``r_new``,
betty/hypergradient/cg.py; its issue #15): after the first iteration it is no longer CG, so
its hypergradient is wrong from 2 iterations on. One iteration, and Neumann, agree."""

from __future__ import annotations

import torch

import penalties as hp
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem, sgd1

PROGRAM = "hpo"
BETTY = None
METHOD = ("cg(iters=30, tol=1e-10) → Config(type='cg', cg_iterations=30): Betty has no tolerance, and "
          "its CG has the old-residual bug (#15)")
UPPERS = ("decay",)
AGREE = ("decay.optimizer=sgd(lr=1.0)", "decay.clip_grad_norm=1e30")
CHECKS = (
    Check("cg(iters=30, tol=1e-10) / cg(30): Betty's CG bug", (), dict(type="cg", cg_iterations=30), same=False),
    Check("cg(iters=1) / cg(1): before the bug acts", ("decay->model.hypergrad=cg(iters=1)",),
          dict(type="cg", cg_iterations=1)),
    Check("neumann(iters=3, alpha=0.1) / neumann", ("decay->model.hypergrad=neumann(iters=3, alpha=0.1)",),
          dict(type="neumann", neumann_iterations=3, neumann_alpha=0.1)),
)
METRIC = "test_loss"
BIGGER = "min"
SEED_STEPS = 100
TINY = ()
AS_WRITTEN = dict(type="cg", cg_iterations=30)
UNROLL = 50


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    model, decay = m["model"], m["decay"]
    m_opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    d_opt = sgd1(decay) if agree else torch.optim.Adam(decay.parameters(), lr=0.05)
    low = problem("model", lambda b: hp.penalized_bce(model, decay, b), model, m_opt,
                  Cast(hp.sparse_logistic(split="train", n=200, batch_size=200), dtype),
                  {**(lower or AS_WRITTEN), "unroll_steps": UNROLL})
    up = problem("decay", lambda b: hp.bce(model, b), decay, d_opt,
                 Cast(hp.sparse_logistic(split="val", n=200, batch_size=200), dtype),
                 dict(gradient_clipping=0.0 if agree else 10.0))
    step = engine([up, low], {up: [low]}, {low: [up]}, calls=UNROLL)
    return BettyProgram(step, m, {"model": low, "decay": up})


def metric(modules) -> float:
    model = modules["model"]
    data = Cast(hp.sparse_logistic(split="test", n=1000, batch_size=1000), next(model.parameters()).dtype)
    return evaluated(lambda: hp.test_loss(model, data), model)
