"""programs/data_reweighting.mlo (Meta-Weight-Net) under Betty: two ImplicitProblems, as in
Betty's own Meta-Weight-Net example. mloc's ``sama(eps=0.01)`` is Betty's ``type="sama"``
with ``sama_adam_alpha=0.01``; Betty's SAMA preconditions only for Adam and returns the vector
unchanged for any other optimizer (``precondition_sgd`` in betty/hypergradient/utils.py), so
over this SGD-with-momentum classifier it computes its ``darts`` numbers, where mloc's SAMA
scales the mixed term by SGD's preconditioner (the learning rate)."""

from __future__ import annotations

import torch

import reweighting as lib
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem, sgd1
from mloc.runtime.program.schedules import cosine

PROGRAM = "data_reweighting"
BETTY = None
METHOD = ("sama(eps=0.01) → Config(type='sama', sama_adam_alpha=0.01): Betty's SAMA drops SGD's "
          "preconditioner (the lr), so it equals its darts")
UPPERS = ("weight_net",)
AGREE = ("weight_net.optimizer=sgd(lr=1.0)",)
CHECKS = (
    Check("sama(eps=0.01) / sama: Betty leaves out SGD's lr", (), dict(type="sama", sama_adam_alpha=0.01), same=False),
    Check("finite_diff(eps=0.01) / darts", ("weight_net->classifier.hypergrad=finite_diff(eps=0.01)",),
          dict(type="darts", darts_alpha=0.01)),
    Check("neumann(iters=3, alpha=0.1) / neumann", ("weight_net->classifier.hypergrad=neumann(iters=3, alpha=0.1)",),
          dict(type="neumann", neumann_iterations=3, neumann_alpha=0.1)),
)
METRIC = "acc"
BIGGER = "max"
SEED_STEPS = 500   # reduced for the shared 2-core machine (the table says so)
TINY = ("classifier.module=lib.MLP(in_features=64, hidden=16, classes=10)",
        "weight_net.module=lib.WeightNet(hidden=8)")
AS_WRITTEN = dict(type="sama", sama_adam_alpha=0.01)


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    c, w = m["classifier"], m["weight_net"]
    c_opt = torch.optim.SGD(c.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(c_opt, cosine(total=3000))
    w_opt = sgd1(w) if agree else torch.optim.Adam(w.parameters(), lr=1e-2, weight_decay=1e-4)
    low = problem("classifier", lambda b: lib.weighted_ce(c, w, b), c, c_opt,
                  Cast(lib.noisy_digits(noise=0.4, batch_size=100), dtype), lower or AS_WRITTEN, sched)
    up = problem("weight_net", lambda b: lib.ce(c, b), w, w_opt, Cast(lib.clean_digits(batch_size=100), dtype))
    step = engine([up, low], {up: [low]}, {low: [up]}, calls=1)
    return BettyProgram(step, m, {"classifier": low, "weight_net": up})


def metric(modules) -> float:
    c = modules["classifier"]
    return evaluated(lambda: lib.accuracy(c, Cast(lib.test_digits(), next(c.parameters()).dtype)), c)
