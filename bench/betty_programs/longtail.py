"""programs/longtail.mlo (Meta-Weight-Net on long-tailed digits, IF = 100) under Betty: two
ImplicitProblems, the data_reweighting row's program (bench/betty_programs/data_reweighting.py)
on other data and schedules, so the same method mapping and checks: mloc's ``sama(eps=0.01)``
is Betty's ``type="sama"``, which over this SGD classifier returns its ``darts`` numbers
(Betty's SAMA preconditions only for Adam), where mloc's scales by SGD's learning rate."""

from __future__ import annotations

import torch

import longtail as lib
from betty_programs.common import BettyProgram, Cast, copies, engine, evaluated, problem, sgd1
from betty_programs.data_reweighting import AS_WRITTEN, CHECKS, METHOD, UPPERS, AGREE  # noqa: F401
from mloc.runtime.program.schedules import cosine

PROGRAM = "longtail"
BETTY = None
METRIC = "acc"
BIGGER = "max"
SEED_STEPS = 1000  # the program's own
TINY = ("classifier.module=lib.MLP(in_features=64, hidden=16, classes=10)",
        "weight_net.module=lib.WeightNet(hidden=8)")


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    c, w = m["classifier"], m["weight_net"]
    c_opt = torch.optim.SGD(c.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(c_opt, cosine(total=1000))
    w_opt = sgd1(w) if agree else torch.optim.Adam(w.parameters(), lr=1e-3, weight_decay=1e-4)
    low = problem("classifier", lambda b: lib.weighted_ce(c, w, b), c, c_opt,
                  Cast(lib.longtail_digits(imbalance=100, batch_size=100), dtype), lower or AS_WRITTEN, sched)
    up = problem("weight_net", lambda b: lib.ce(c, b), w, w_opt, Cast(lib.meta_digits(batch_size=100), dtype))
    step = engine([up, low], {up: [low]}, {low: [up]}, calls=1)
    return BettyProgram(step, m, {"classifier": low, "weight_net": up})


def metric(modules) -> float:
    c = modules["classifier"]
    return evaluated(lambda: lib.accuracy(c, lib.test_digits()), c)
