"""programs/darts.mlo under Betty, as bench/darts_vs_betty.py builds it: two ImplicitProblems;
mloc's ``finite_diff(eps=0.01)`` is Betty's ``type="darts"``, ``darts_alpha=0.01`` (the same
central difference at ε = 0.01/‖v‖). The upper problem needs ``retain_graph=True`` (its loss
reads α directly as well as through the network). Betty's finite-difference passes and its
upper loss run the network in training mode, so they update BatchNorm's running statistics
(three extra updates per step: the buffers column); mloc restores them."""

from __future__ import annotations

import torch

import darts as lib
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem, sgd1
from mloc.runtime.program.schedules import cosine

PROGRAM = "darts"
BETTY = None
METHOD = ("finite_diff(eps=0.01) → Config(type='darts', darts_alpha=0.01): the same method (ξ = 1; the "
          "program as written takes DARTS' ξ = 0.05, which Betty's darts cannot express); Betty's "
          "finite differences update BatchNorm statistics")
UPPERS = ("arch",)
AGREE = ("arch.optimizer=sgd(lr=1.0)",)
CHECKS = (Check("finite_diff(eps=0.01) / darts", ("arch->net.hypergrad=finite_diff(eps=0.01)",),
                dict(type="darts", darts_alpha=0.01)),)
METRIC = "acc"
BIGGER = "max"
SEED_STEPS = 200
TINY = ("net.module=lib.Network(channels=4, cells=1)",)
AS_WRITTEN = dict(type="darts", darts_alpha=0.01)


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    net, arch = m["net"], m["arch"]
    w_opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(w_opt, cosine(total=200))
    a_opt = sgd1(arch) if agree else torch.optim.Adam(arch.parameters(), lr=3e-3, betas=(0.5, 0.999),
                                                      weight_decay=1e-3)
    low = problem("net", lambda b: lib.ce(net, arch, b), net, w_opt,
                  Cast(lib.digits("search_train", batch_size=64, seed=1), dtype), lower or AS_WRITTEN, sched)
    up = problem("arch", lambda b: lib.ce(net, arch, b), arch, a_opt,
                 Cast(lib.digits("search_val", batch_size=64, seed=2), dtype), dict(retain_graph=True))
    step = engine([up, low], {up: [low]}, {low: [up]}, calls=1)
    return BettyProgram(step, m, {"net": low, "arch": up})


def metric(modules) -> float:
    net, arch = modules["net"], modules["arch"]
    return evaluated(lambda: lib.accuracy(net, arch, "search_val"), net, arch)
