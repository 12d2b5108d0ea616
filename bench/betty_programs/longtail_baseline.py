"""programs/longtail_baseline.mlo (longtail.mlo's baseline: the same classifier with the
class-balanced loss, no weight net) under Betty: one ImplicitProblem in an Engine with no
dependencies, as the ``hpo_grid`` row does. No hypergradient: the check compares the
parameters after the first SGD step, and the row measures what Betty's bookkeeping costs on a
plain training step."""

from __future__ import annotations

import torch

import longtail as lib
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem
from mloc.runtime.program.schedules import cosine

PROGRAM = "longtail_baseline"
BETTY = None
METHOD = "one level, no hypergradient: one Problem, no u2l/l2u"
UPPERS = ()
AGREE = ()
CHECKS = (Check("one SGD step (no upper problem)", (), {}),)
METRIC = "acc"
BIGGER = "max"
SEED_STEPS = 1000  # the program's own
TINY = ("classifier.module=lib.MLP(in_features=64, hidden=16, classes=10)",)


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    c = m["classifier"]
    opt = torch.optim.SGD(c.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine(total=1000))
    low = problem("classifier", lambda b: lib.class_balanced_ce(c, b, beta=0.999), c, opt,
                  Cast(lib.longtail_digits(imbalance=100, batch_size=100), dtype), lower, sched)
    step = engine([low], {}, {}, calls=1)
    return BettyProgram(step, m, {"classifier": low})


def metric(modules) -> float:
    c = modules["classifier"]
    return evaluated(lambda: lib.accuracy(c, lib.test_digits()), c)
