"""programs/imaml.mlo (iMAML on sinusoids) under Betty, as Betty's own iMAML example writes it:
the inner problem reloads the meta weights when its inner loop starts (``on_inner_loop_start``,
mloc's ``init = meta``), 5 inner steps per task (``unroll_steps=5``), 4 tasks per meta step
(``gradient_accumulation=4``, mloc's ``accumulate = 4``). mloc's ``cg(iters=10)`` is Betty's
``type="cg"``, ``cg_iterations=10``, but they are two formulas: with ``init = meta`` mloc
differentiates θ = φ + δ and computes λq_K + r_K (r_K = v − Hq_K the solver's residual,
tests/test_imaml_truncated.py), Betty's separate inner weights give λq_K (the iMAML paper's
Algorithm 2); they meet only when the solve is exact. Betty's CG bug (hpo.py) comes on top."""

from __future__ import annotations

import sys

import torch

import sinusoid as tasks
from betty_programs.common import Check, BettyProgram, Cast, copies, engine, evaluated, problem, sgd1

PROGRAM = "imaml"
BETTY = None
METHOD = ("cg(iters=10) → Config(type='cg', cg_iterations=10): mloc computes λq+r (θ = φ + δ), Betty "
          "λq; plus Betty's CG bug")
UPPERS = ("meta",)
AGREE = ("meta.optimizer=sgd(lr=1.0)",)
CHECKS = (
    Check("cg(iters=10) / cg(10): residual term and Betty's CG bug", (), dict(type="cg", cg_iterations=10),
          same=False),
    Check("cg(iters=1) / cg(1): the residual term alone", ("meta->adapt.hypergrad=cg(iters=1)",),
          dict(type="cg", cg_iterations=1), same=False),
)
METRIC = "zero_shot_error"
BIGGER = "min"
SEED_STEPS = 100   # reduced for the shared 2-core machine (the table says so)
TINY = ("meta.module=tasks.SineNet(hidden=8)", "adapt.module=tasks.SineNet(hidden=8)")
AS_WRITTEN = dict(type="cg", cg_iterations=10)
UNROLL, TASKS = 5, 4


def build(modules, *, dtype=torch.float32, agree=False, lower=None, steps=SEED_STEPS) -> BettyProgram:
    m = copies(modules)
    meta, adapt = m["meta"], m["adapt"]

    def start_from_meta(self):
        with torch.no_grad():
            for p, q in zip(adapt.parameters(), meta.parameters()):
                p.copy_(q)

    low = problem("adapt", lambda b: tasks.proximal_mse(adapt, meta, b, lam=10.0), adapt,
                  torch.optim.SGD(adapt.parameters(), lr=0.01),
                  Cast(tasks.sine_tasks(split="support", shots=10, repeat=5), dtype),
                  {**(lower or AS_WRITTEN), "unroll_steps": UNROLL}, hooks={"on_inner_loop_start": start_from_meta})
    up = problem("meta", lambda b: tasks.mse(adapt, b), meta,
                 sgd1(meta) if agree else torch.optim.Adam(meta.parameters(), lr=1e-3),
                 Cast(tasks.sine_tasks(split="query", shots=10, repeat=1), dtype), dict(gradient_accumulation=TASKS))
    step = engine([up, low], {up: [low]}, {low: [up]}, calls=UNROLL * TASKS)
    return BettyProgram(step, m, {"adapt": low, "meta": up})


def metric(modules) -> float:
    meta = modules["meta"]
    data = Cast(tasks.sine_tasks(split="query", seed=99), next(meta.parameters()).dtype)
    return evaluated(lambda: tasks.zero_shot_error(meta, data), meta)


def evidence() -> list[tuple[str, str]]:
    """Betty's first meta-gradient against λq_K computed by hand (textbook CG on the explicit
    Hessian, tests/test_imaml_truncated.py's ``hand``), 97-parameter nets, float64: equal at
    K = 1 (so the program is the same and the formula is the paper's), not at K = 10 (the bug)."""
    from betty_programs.common import ROOT, hypergradient, one_step
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.test_imaml_truncated import cg, hand
    out = []
    for k in (1, 10):
        init, m, b = one_step(sys.modules[__name__], [*TINY, f"meta->adapt.hypergrad=cg(iters={k})"],
                              dict(type="cg", cg_iterations=k))
        phi = {n: p.detach().clone() for n, p in init["meta"].named_parameters()}
        ours, paper = hand(init["meta"], phi, lambda h, v, k=k: cg(h, v, k))
        g_m, g_b = hypergradient(sys.modules[__name__], init, m), hypergradient(sys.modules[__name__], init, b)
        out.append((f"cg({k}), hidden 8: Betty against λq_{k} by hand / mloc against λq_{k} + r_{k} by hand",
                    f"{float((g_b - paper).norm() / paper.norm()):.1e} / {float((g_m - ours).norm() / ours.norm()):.1e}"))
    return out
