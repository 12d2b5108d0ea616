"""programs/lbi.mlo (learning by ignoring: ignore → pretrain → finetune, the pre-training loss
reading the fine-tuned model through (μ/2)‖W − V‖², μ = 0.01) and Betty.

Betty's hypergradient of a problem is a sum over paths of its ``l2u`` graph (``a → b``: b's loss
reads a), each path applying the best-response Jacobian of every problem on it. Written as the
losses read, ``l2u = {pretrain: [finetune], finetune: [pretrain, ignore]}``: the μ term makes
pretrain ⇄ finetune a cycle and Betty's path search (``Engine.dfs``, no visited set) recurses
without end, as for trilevel.mlo. Betty's own LBI example (examples/learning_by_ignoring)
arranges the problems otherwise: ``u2l = {reweight: [pretrain]}`` only, with finetune an
``l2u`` child of pretrain and the top's path ``pretrain → finetune → reweight``; pretrain is the
leaf (stepped first), and neither lower problem has paths of its own, so ``neumann`` accepts
both (its ``assert len(curr.paths) == 0``). That graph has no room for the feedback edge:
Betty then differentiates the program as if μ's term did not read a best response, which is
mloc's ``per_edge``, not the program's ``exact``. The row measures both on a tiny float64
instance (4 inputs, 2 hidden units, 12 source examples; the program's neumann(3, 0.5) on both
edges; one outer step, ignore stepped by SGD with rate 1): Betty's arrangement against mloc's
first top hypergradient under ``exact`` and ``per_edge``, at μ = 0.01 and at μ = 0 (the paper's
program, where the two semantics coincide)."""

from __future__ import annotations

import copy

import torch

import lbi as lib
from betty_programs.common import ROOT, Cast, copies, engine, failure, problem, sgd1

PROGRAM = "lbi"
BETTY = ("feedback (the pre-training loss reads the fine-tuned model, μ > 0) makes Betty's l2u graph a cycle "
         "(Engine.dfs recurses without end); its own LBI arrangement has no feedback edge: mloc's per_edge, not exact")
METHOD = ("neumann(iters=3, alpha=0.5) on both edges, exact semantics → Config(type='neumann') on finetune and "
          "pretrain in Betty's LBI arrangement: per-edge only")
NEUMANN = dict(type="neumann", neumann_iterations=3, neumann_alpha=0.5)
TINY = ["finetune.module.features=4", "finetune.module.hidden=2", "pretrain.module.features=4",
        "pretrain.module.hidden=2", "finetune.data.size=6", "finetune.data.pool=4", "pretrain.data.size=12",
        "pretrain.data.batch_size=12", "pretrain.data.pool=4", "ignore.module.size=12", "ignore.data.size=6",
        "ignore.data.pool=4"]
_TINY_DATA = dict(source=dict(batch_size=12, size=12, pool=4), train=dict(size=6, pool=4), val=dict(size=6, pool=4))


def _problems(modules, dtype, mu, tiny=False, agree=False, pretrain_lr=0.1):
    d = _TINY_DATA if tiny else dict(source={}, train={}, val={})
    m = copies(modules)
    f, p, i = m["finetune"], m["pretrain"], m["ignore"]
    fp = problem("finetune", lambda b: lib.proximal_ce(f, p, b, lam=0.05), f,
                 torch.optim.SGD(f.parameters(), lr=0.1, momentum=0.9), Cast(lib.target("train", **d["train"]), dtype),
                 NEUMANN)
    pp = problem("pretrain", lambda b: lib.ignoring_ce(p, i, f, b, mu=mu), p,
                 torch.optim.SGD(p.parameters(), lr=pretrain_lr, momentum=0.9), Cast(lib.source(**d["source"]), dtype), NEUMANN)
    ip = problem("ignore", lambda b: lib.ce(f, b), i,
                 sgd1(i) if agree else torch.optim.Adam(i.parameters(), lr=0.01, betas=(0.5, 0.999)),
                 Cast(lib.target("val", **d["val"]), dtype))
    return m, fp, pp, ip


def _as_read():
    """The program as written (μ = 0.01), l2u following every read: a cycle."""
    modules = {"finetune": lib.Net(64, 32), "pretrain": lib.Net(64, 32), "ignore": lib.Ignore(1000)}
    _, fp, pp, ip = _problems(modules, torch.float32, mu=0.01)
    engine([ip, pp, fp], {ip: [pp], pp: [fp]}, {pp: [fp], fp: [pp, ip]}, calls=1)()


def first_top(mu: float, semantics: str, pretrain_lr: float = 1e-12) -> float:
    """‖g_Betty − g_mloc‖ / ‖g_mloc‖ of the first top hypergradient, float64, tiny instance:
    Betty in its LBI arrangement, mloc with ``semantics`` at ``pretrain.loss.mu=mu``.
    ``pretrain_lr``: the middle problem's SGD rate in both. Betty steps pretrain first (the
    leaf) and fine-tunes from the new W₁, mloc fine-tunes from W₀: at rate 1e-12 (mloc wants a
    positive rate) the states at which the top's hypergradient is taken differ by O(1e-12),
    below float64 round-off (the effect is linear in the rate: 3.9e-5 at 0.1), so only the
    method is compared (the best-response Jacobians do not read the rate); at the program's
    0.1 the order shows."""
    import mloc
    prog = mloc.load(ROOT / "programs" / "lbi.mlo", dtype="float64",
                     set=[*TINY, "ignore.optimizer=sgd(lr=1.0)", f"pretrain.loss.mu={mu}", f"semantics={semantics}",
                          f"pretrain.optimizer=sgd(lr={pretrain_lr}, momentum=0.9)"])
    init = {n: copy.deepcopy(prog.module(n)) for n in prog.program.live}
    m, fp, pp, ip = _problems(init, torch.float64, mu, tiny=True, agree=True, pretrain_lr=pretrain_lr)
    engine([ip, pp, fp], {ip: [pp]}, {pp: [fp], fp: [ip]}, calls=1)()
    prog.step()
    a0 = init["ignore"].logits.detach()
    g_m, g_b = a0 - prog.module("ignore").logits.detach(), a0 - m["ignore"].logits.detach()
    if not float(g_m.norm()) > 0:
        raise RuntimeError("mloc's first top hypergradient is 0: nothing to compare")
    return float((g_b - g_m).norm() / g_m.norm())


def betty_runs(seeds=(1, 2, 3), steps: int = 300) -> list[float]:
    """The program as Betty can run it (its LBI arrangement, μ = 0.01, pretrain stepped first):
    ``steps`` outer steps from each seed's initial modules (``mloc.load(seed=s)``), float32;
    the fine-tuned model's test accuracy (the program's ``test_acc``) per seed."""
    import mloc
    out = []
    for s in seeds:
        prog = mloc.load(ROOT / "programs" / "lbi.mlo", seed=s)
        m, fp, pp, ip = _problems({n: prog.module(n) for n in prog.program.live}, torch.float32, mu=0.01)
        step = engine([ip, pp, fp], {ip: [pp]}, {pp: [fp], fp: [ip]}, calls=1)
        for _ in range(steps):
            step()
        out.append(lib.accuracy(m["finetune"], "test"))
    return out


def evidence() -> list[tuple[str, str]]:
    return [("l2u as the losses read (μ = 0.01: pretrain ⇄ finetune)", failure(_as_read)),
            ("Betty's LBI arrangement, first top hypergradient against mloc's, float64, tiny, pretrain's rate 1e-12 "
             "for the step, μ = 0.01: exact / per_edge", f"{first_top(0.01, 'exact'):.1e} / {first_top(0.01, 'per_edge'):.1e}"),
            ("the same at μ = 0 (the paper's program): exact / per_edge",
             f"{first_top(0.0, 'exact'):.1e} / {first_top(0.0, 'per_edge'):.1e}"),
            ("the same at μ = 0 with pretrain's rate 0.1 as written (Betty steps pretrain first, mloc finetune)",
             f"{first_top(0.0, 'per_edge', 0.1):.1e}"),
            ("Betty's LBI arrangement as written (μ = 0.01), 300 steps, target test accuracy, seeds 1, 2, 3",
             ", ".join(f"{a:.4f}" for a in betty_runs()))]
