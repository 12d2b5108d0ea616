"""programs/trilevel.mlo (strength → weight net → classifier, the middle loss reading the
classifier: feedback) and Betty.

Betty's hypergradient of a problem is a sum over paths of its ``l2u`` graph, where ``a → b``
means b's loss reads a; each path applies the best-response Jacobian of a problem whose loss
reads the next. Here the reads are a cycle: the classifier reads the weight net and the weight
net reads the classifier. Written as the program reads, ``l2u = {weight_net: [classifier],
classifier: [weight_net, strength]}``, Betty's path search (``Engine.dfs``, no visited set)
recurses without end. Dropping the feedback edge to make it acyclic leaves the strength's only
path through the weight net, whose loss the strength's does not read, and the step fails. Both
are reproduced here: without the feedback edge Betty's ``neumann`` (the program's method)
refuses the weight net, a problem with paths of its own (``assert len(curr.paths) == 0``);
with ``darts`` there (which has no such check) it runs, but the strength's hypergradient is
0: it never moves. (And Betty's semantics are per-edge, where the program asks for ``exact``.)"""

from __future__ import annotations

import torch

import regularized as lib
from betty_programs.common import Cast, copies, engine, failure, problem

PROGRAM = "trilevel"
BETTY = ("feedback (the middle loss reads the bottom) makes Betty's l2u graph a cycle (Engine.dfs recurses "
         "without end); acyclic, the top's only path misses the classifier: hypergradient 0")
METHOD = "neumann(iters=3, alpha=0.1) on both edges, exact semantics → Betty: per-edge only; neumann refuses a middle problem"


def _problems():
    m = copies({"classifier": lib.MLP(in_features=64, hidden=128, classes=10), "weight_net": lib.WeightNet(hidden=100),
                "strength": lib.Strength(init=-4.0)})
    c, w, s = m["classifier"], m["weight_net"], m["strength"]
    f32 = torch.float32
    cp = problem("classifier", lambda b: lib.weighted_ce(c, w, b), c, torch.optim.SGD(c.parameters(), lr=0.1, momentum=0.9),
                 Cast(lib.noisy_digits(noise=0.4, batch_size=100), f32), dict(type="neumann", neumann_iterations=3,
                                                                             neumann_alpha=0.1))
    wp = problem("weight_net", lambda b: lib.regularized_ce(c, w, s, b), w, torch.optim.Adam(w.parameters(), lr=1e-3),
                 Cast(lib.clean_digits(batch_size=100), f32), dict(type="neumann", neumann_iterations=3, neumann_alpha=0.1))
    sp = problem("strength", lambda b: lib.ce(c, b), s, torch.optim.Adam(s.parameters(), lr=1e-2),
                 Cast(lib.heldout_digits(batch_size=100), f32))
    return cp, wp, sp


def _as_read():
    c, w, s = _problems()
    engine([s, w, c], {s: [w], w: [c]}, {w: [c], c: [w, s]}, calls=1)()


def _acyclic(middle: str | None = None, steps: int = 1) -> float:
    """The graph without the feedback edge, the middle retaining its graph (its loss reads
    itself directly too); ``middle``: another type for its BR. The strength's move."""
    c, w, s = _problems()
    w._retain_graph = True
    if middle:
        w.config.type = middle
    start = float(s.module.log_strength)
    step = engine([s, w, c], {s: [w], w: [c]}, {c: [w, s], w: [s]}, calls=1)
    for _ in range(steps):
        step()
    return float(s.module.log_strength) - start


def _mloc_move(steps: int) -> float:
    import mloc
    from betty_programs.common import ROOT
    prog = mloc.load(ROOT / "programs" / "trilevel.mlo")
    start = float(prog.module("strength").log_strength)
    prog.run(steps)
    return float(prog.module("strength").log_strength) - start


def evidence() -> list[tuple[str, str]]:
    return [("l2u as the losses read (weight_net ⇄ classifier)", failure(_as_read)),
            ("l2u without the feedback edge, neumann as written", failure(_acyclic)),
            ("the same with darts in the middle: the strength's move in 3 steps, Betty / mloc",
             f"{_acyclic('darts', 3):.1e} / {_mloc_move(3):.1e}")]
