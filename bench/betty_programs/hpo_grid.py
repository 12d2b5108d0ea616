"""programs/hpo_grid.mlo (hpo.mlo's baseline: one shared weight decay, no upper problem)
under Betty: one ImplicitProblem in an Engine with no dependencies. No hypergradient: the
check compares the parameters after the first SGD step, and the row measures what Betty's
bookkeeping costs on a plain training step."""

from __future__ import annotations

import torch

import penalties as hp
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem

PROGRAM = "hpo_grid"
BETTY = None
METHOD = "one level, no hypergradient: one Problem, no u2l/l2u"
UPPERS = ()
AGREE = ()
CHECKS = (Check("one SGD step (no upper problem)", (), {}),)
METRIC = "test_loss"
BIGGER = "min"
SEED_STEPS = 500
TINY = ()


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    model = m["model"]
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    low = problem("model", lambda b: hp.shared_penalized_bce(model, b, log_decay=-2.0), model, opt,
                  Cast(hp.sparse_logistic(split="train", n=200, batch_size=200), dtype), lower)
    step = engine([low], {}, {}, calls=1)
    return BettyProgram(step, m, {"model": low})


def metric(modules) -> float:
    model = modules["model"]
    data = Cast(hp.sparse_logistic(split="test", n=1000, batch_size=1000), next(model.parameters()).dtype)
    return evaluated(lambda: hp.test_loss(model, data), model)
