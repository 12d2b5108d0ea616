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


def _dot(a, b) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b))


def fixed_cg(vector, curr, prev, sync):
    """Betty's ``cg`` BR-VJP with the textbook recurrence (Hestenes & Stiefel 1952): the next
    direction from the *new* residual. Same calling convention as betty/hypergradient/cg.py
    (``sync``: accumulate into the upper problem's ``.grad`` instead of returning)."""
    params = curr.trainable_parameters()
    g = torch.autograd.grad(curr.training_step_exec(curr.cur_batch), params, create_graph=True)
    x = [torch.zeros_like(v) for v in vector]
    r = [v.detach().clone() for v in vector]
    p = [t.clone() for t in r]
    rr = _dot(r, r)
    for _ in range(curr.config.cg_iterations):
        hp = torch.autograd.grad(g, params, grad_outputs=p, retain_graph=True)
        alpha = rr / _dot(hp, p)
        x = [a + alpha * b for a, b in zip(x, p)]
        r = [a - alpha * b for a, b in zip(r, hp)]
        rr, rr_old = _dot(r, r), rr
        p = [a + (rr / rr_old) * b for a, b in zip(r, p)]
    ups = prev.trainable_parameters()
    cross = torch.autograd.grad(g, ups, grad_outputs=x, allow_unused=True)
    out = [torch.zeros_like(u) if c is None else -c for c, u in zip(cross, ups)]
    if sync:
        prev.set_grads(ups, out)
        return None
    return out


def evidence() -> list[tuple[str, str]]:
    """Betty's cg(10) against mloc's, as released and with :func:`fixed_cg` patched in."""
    import sys

    import betty.hypergradient as bh
    from betty_programs.common import hypergradient, one_step
    row, sets, cfg = sys.modules[__name__], ("decay->model.hypergrad=cg(iters=10)",), dict(type="cg", cg_iterations=10)
    out = []
    for label, fn in (("as released", bh.jvp_fn_mapping["cg"]), ("direction from the new residual", fixed_cg)):
        saved, bh.jvp_fn_mapping["cg"] = bh.jvp_fn_mapping["cg"], fn
        try:
            init, m, b = one_step(row, sets, cfg)
        finally:
            bh.jvp_fn_mapping["cg"] = saved
        g_m, g_b = hypergradient(row, init, m), hypergradient(row, init, b)
        out.append((f"first hypergradient, float64, cg(10): Betty's CG {label} against mloc's",
                    f"{float((g_b - g_m).norm() / g_m.norm()):.1e}"))
    return out
