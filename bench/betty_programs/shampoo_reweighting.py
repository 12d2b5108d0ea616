"""programs/shampoo_reweighting.mlo (Meta-Weight-Net, Shampoo below, SAMA above) and Betty.

Betty 0.2.1 has no Shampoo, but takes any ``torch.optim.Optimizer``; the nearest program is
pytorch-optimizer's ``Shampoo`` (another implementation: no grafting, roots every step, no
background worker) under ``type="sama"``. Betty's SAMA then does not precondition by it:
``get_optimzer_type`` (betty/hypergradient/utils.py) looks for "adam" or "rmsprop" in the class
name and treats everything else as SGD, whose preconditioner it returns as the identity (SGD's
lr left out, as in data_reweighting.py). The evidence: Betty's ``sama`` hypergradient equals
its ``darts`` one bit for bit under that Shampoo, where mloc's SAMA over its Shampoo differs
from its ``finite_diff`` by Shampoo's diagonal (the grafting scale times the roots' diagonal)."""

from __future__ import annotations

import torch

import reweighting as lib
from betty_programs.common import (BettyProgram, Cast, copies, engine, hypergradient, one_step, problem,
                                   sgd1)

PROGRAM = "shampoo_reweighting"
BETTY = ("no Shampoo; with another library's, its SAMA preconditions any optimizer but Adam as SGD "
         "without the lr (get_optimzer_type → precondition_sgd): not SAMA over Shampoo")
METHOD = "sama(eps=0.01) over Shampoo → Config(type='sama'): Shampoo's diagonal ignored"
UPPERS = ("weight_net",)
AGREE = ("weight_net.optimizer=sgd(lr=1.0)",)
CHECKS = ()
TINY = ()


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=300) -> BettyProgram:
    """Betty's nearest program: pytorch-optimizer's Shampoo (lr 0.02, momentum 0.9) below."""
    from pytorch_optimizer import Shampoo
    m = copies(modules)
    c, w = m["classifier"], m["weight_net"]
    low = problem("classifier", lambda b: lib.weighted_ce(c, w, b), c, Shampoo(c.parameters(), lr=0.02, momentum=0.9),
                  Cast(lib.noisy_digits(noise=0.4, batch_size=100), dtype), lower or dict(type="sama", sama_adam_alpha=0.01))
    up = problem("weight_net", lambda b: lib.ce(c, b), w,
                 sgd1(w) if agree else torch.optim.Adam(w.parameters(), lr=1e-2, weight_decay=1e-4),
                 Cast(lib.clean_digits(batch_size=100), dtype))
    return BettyProgram(engine([up, low], {up: [low]}, {low: [up]}, calls=1), m, {"classifier": low, "weight_net": up})


def _rel(a, b) -> str:
    return f"{float((a - b).norm() / b.norm()):.1e}"


def evidence() -> list[tuple[str, str]]:
    import sys
    row = sys.modules[__name__]
    init, _, b_sama = one_step(row, (), dict(type="sama", sama_adam_alpha=0.01))
    _, _, b_darts = one_step(row, (), dict(type="darts", darts_alpha=0.01))
    i2, m_sama, _ = one_step(row, (), None)
    _, m_fd, _ = one_step(row, ("weight_net->classifier.hypergrad=finite_diff(eps=0.01)",), None)
    return [("first hypergradient, float64: Betty sama against Betty darts (pytorch-optimizer Shampoo below)",
             _rel(hypergradient(row, init, b_sama), hypergradient(row, init, b_darts))),
            ("the same for mloc: sama against finite_diff (mloc's Shampoo below)",
             _rel(hypergradient(row, i2, m_sama), hypergradient(row, i2, m_fd)))]
