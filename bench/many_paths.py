"""Benchmark (issue 27): a many-path lattice, mloc's adjoint accumulation against Betty's
path enumeration: the top problem's step time, BR-VJPs per step, hypergradient agreement.

The program, for L = 3..6 levels (float64, every problem a parameter vector of dimension
``d``, default 32): a **top** problem λ; one **bottom** problem whose loss reads λ; then
L − 2 levels of two problems each, every one of which reads both problems of the level
before it (the first such level reads the bottom); the top's loss reads the last level:

    bottom:  ½θᵀAθ − θᵀ(B θ_top + c)
    m_k_i:   ½θᵀAθ − θᵀ(Σ_{u ∈ level k−1} B_u θ_u + c)          (A SPD, spectrum in [1, 4])
    top:     ½‖Σ_{u ∈ last level} C_u θ_u − e‖² + ½ρ‖λ‖²

Betty calls the bottom the leaf and the levels of two its uppers (``l2u``: bottom → m1_*,
m_k_* → m_{k+1}_*, last level → top; each upper's loss reads the problems below it), with
the one ``u2l`` edge top → bottom (the bottom's loss reads λ). The top's hypergradient
then runs through 2^(L−2) paths from the bottom up to the top, and Betty's ``get_grads``
applies every BR-VJP of a path anew: Σ over paths of the path's length = 2^(L−2)·(L−1)
BR-VJPs per step (16 paths and 80 BR-VJPs at 6 levels). mloc (``semantics="per_edge"``,
which is Betty's; the same here as ``exact``: no problem feeds back into one it answers
to) has the edges "lower solved given upper" along the same reads (top → bottom,
bottom → m1_*, m_k_* → m_{k+1}_*) and accumulates adjoints in reverse topological order:
one BR-VJP per problem below the top, 2L − 3.

Both systems run the same loss functions (``Lattice.loss``) on their own copies of the
same parameters (nn.Modules holding the vectors for Betty), with Neumann BR-VJPs of the
same K and α (Betty's ``neumann`` is only allowed on problems without paths of their
own, which holds here; its ``cg`` has the old-residual bug) and SGD on the top. The timed
step is the top problem's whole step, what each system runs for it in training: mloc
``hier.hypergrad("top"); top.step()`` (then ``.grad`` cleared, as Betty does), Betty
``top.one_step_descent()`` (loss, direct gradient and every path's ``get_grads`` into
``.grad``, ``torch.optim.SGD`` step, ``zero_grad``). The lower problems are not stepped,
so each rep is the top's step at a new λ and the same lowers in both systems.

Counts and agreement are taken on one untimed step at the first state: BR-VJPs by
wrapping mloc's ``neumann.vjp`` and Betty's ``jvp_fn_mapping["neumann"]``, paths by
wrapping Betty's ``get_grads``; agreement is the max relative difference of the two
hypergradients of λ (mloc ``hypergrad(accumulate=False)``, Betty its ``backward`` into
``.grad``). After the timed steps the two λ are compared again (the same training run).

Timing: one thread (``torch.set_num_threads(1)``); the two systems interleaved in one
process, each rep in a fresh random order, every step timed alone by the thread's CPU
time (``time.thread_time_ns``, the table) and by wall time; medians after the warm-up.

    python3 bench/many_paths.py [--levels 3,4,5,6] [--reps 200] [--warmup 20] [--dim 32]
                                [--iters 3] [--alpha 0.1]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mloc.ir.composition import compositions_of  # noqa: E402
from mloc.runtime import Edge, Hierarchy, Problem, neumann, sgd  # noqa: E402
from mloc.runtime.methods import implicit  # noqa: E402

F64 = torch.float64
DIM, ITERS, ALPHA, LR, RHO, OUT = 32, 3, 0.1, 0.1, 0.1, 8
TOP = "top"


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=F64)


def _spd(g, d, lo=1.0, hi=4.0):
    q, _ = torch.linalg.qr(_randn(g, d, d))
    eig = lo + (hi - lo) * torch.rand(d, generator=g, dtype=F64)
    return q @ torch.diag(eig) @ q.T


class Lattice:
    """The program (module docstring): structure, data, the loss of every problem, and a
    start where every lower is at its exact best response to the initial λ."""

    def __init__(self, levels: int, dim: int = DIM, seed: int = 0):
        if levels < 3:
            raise ValueError("the lattice has at least 3 levels (top, bottom, one level of two)")
        g = torch.Generator().manual_seed(seed)
        self.levels, self.dim = levels, dim
        self.middle = [[f"m{k}_{i}" for i in (0, 1)] for k in range(1, levels - 1)]
        self.reads = {"bottom": (TOP,)}  # the problems each loss reads besides its own
        previous = ["bottom"]
        for level in self.middle:
            self.reads.update({n: tuple(previous) for n in level})
            previous = level
        self.reads[TOP] = tuple(previous)
        self.lowers = ["bottom"] + [n for level in self.middle for n in level]  # top-down
        self.A = {n: _spd(g, dim) for n in self.lowers}
        self.B = {(n, u): _randn(g, dim, dim) / dim ** 0.5 for n in self.lowers for u in self.reads[n]}
        self.c = {n: _randn(g, dim) for n in self.lowers}
        self.C = {u: _randn(g, OUT, dim) / dim ** 0.5 for u in self.reads[TOP]}
        self.e = _randn(g, OUT)
        self.start = {TOP: _randn(g, dim)}
        for n in self.lowers:  # the exact best responses, top-down
            self.start[n] = torch.linalg.solve(self.A[n], self._rhs(n, [self.start[u] for u in self.reads[n]]))

    @property
    def names(self):
        return [TOP] + self.lowers

    def paths(self) -> int:
        """Paths from the bottom up to the top along the reads: 2^(L−2)."""
        return 2 ** (self.levels - 2)

    def betty_vjps(self) -> int:
        """Σ over Betty's paths of the path's length (problems below the top on it)."""
        return self.paths() * (self.levels - 1)

    def _rhs(self, n, ups):
        return sum(self.B[n, u] @ t for u, t in zip(self.reads[n], ups)) + self.c[n]

    def loss(self, n, theta, *ups):
        """Problem ``n``'s loss at its vector ``theta`` and those it reads (``reads[n]`` order)."""
        if n == TOP:
            y = sum(self.C[u] @ t for u, t in zip(self.reads[TOP], ups)) - self.e
            return 0.5 * (y @ y) + 0.5 * RHO * (theta @ theta)
        return 0.5 * theta @ (self.A[n] @ theta) - theta @ self._rhs(n, ups)


# --- the two systems ---------------------------------------------------------------------
def mloc_system(lat: Lattice, iters: int = ITERS, alpha: float = ALPHA):
    """``(hierarchy, problems by name)``: the lattice as mloc's runtime program."""
    method = neumann(iters, alpha)
    problems = []
    for n in lat.names:
        theta = lat.start[n].clone().requires_grad_(True)
        loss = (lambda n: lambda *args: lat.loss(n, *[a[0] for a in args]))(n)
        problems.append(Problem(n, (theta,), loss, (n, *lat.reads[n]), sgd(LR)))
    edges = [Edge(u, n, method) for n in lat.lowers for u in lat.reads[n]]
    hier = Hierarchy(problems, edges, "per_edge",
                     compositions=compositions_of(problems, edges, "per_edge"))
    return hier, {p.name: p for p in problems}


class Vector(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.theta = torch.nn.Parameter(value.clone())


def betty_system(lat: Lattice, iters: int = ITERS, alpha: float = ALPHA):
    """``(engine, problems by name)``: the lattice as Betty ``ImplicitProblem``s."""
    from betty.configs import Config, EngineConfig
    from betty.engine import Engine
    from betty.logging.logger_base import get_logger
    from betty.problems import ImplicitProblem

    get_logger().setLevel(logging.WARNING)  # Betty logs its set-up at INFO to stdout

    class Level(ImplicitProblem):
        def training_step(self, batch):
            return self.lattice_loss()

    modules = {n: Vector(lat.start[n]) for n in lat.names}
    problems = {}
    for n in lat.names:
        config = Config(type="neumann", neumann_iterations=iters, neumann_alpha=alpha,
                        retain_graph=n == TOP)  # the top's loss graph serves every path
        p = Level(name=n, config=config, module=modules[n],
                  optimizer=torch.optim.SGD(modules[n].parameters(), lr=LR))
        p.lattice_loss = (lambda n: lambda: lat.loss(n, modules[n].theta,
                                                     *[modules[u].theta for u in lat.reads[n]]))(n)
        problems[n] = p
    l2u = {}
    for n in [*lat.lowers[1:], TOP]:  # every read but the bottom's of the top
        for u in lat.reads[n]:
            l2u.setdefault(problems[u], []).append(problems[n])
    engine = Engine(problems=list(problems.values()),
                    config=EngineConfig(train_iters=10**9, strategy="cpu", logger_type="none"),
                    dependencies={"u2l": {problems[TOP]: [problems["bottom"]]}, "l2u": l2u})
    engine.train()
    return engine, problems


def mloc_step(hier, problems):
    top = problems[TOP]
    hier.hypergrad(TOP)
    top.step()
    for p in top.params:
        p.grad = None


def betty_step(problems):
    problems[TOP].one_step_descent(batch=())


# --- counts and agreement (untimed) ------------------------------------------------------
@contextlib.contextmanager
def counting():
    """Count mloc's Neumann BR-VJPs, Betty's and Betty's ``get_grads`` calls (one per path)."""
    counts = {"mloc": 0, "betty": 0, "paths": 0}
    original = implicit.neumann.vjp

    def mloc_vjp(self, op, v, create_graph=False):
        counts["mloc"] += 1
        return original(self, op, v, create_graph)

    implicit.neumann.vjp = mloc_vjp
    patches = []
    try:
        import betty.hypergradient as bh
        import betty.problems.problem as bp
    except ImportError:
        bh = bp = None
    if bh is not None:
        jvp, get_grads = bh.jvp_fn_mapping["neumann"], bp.get_grads

        def betty_jvp(*args):
            counts["betty"] += 1
            return jvp(*args)

        def betty_get_grads(*args):
            counts["paths"] += 1
            return get_grads(*args)
        bh.jvp_fn_mapping["neumann"], bp.get_grads = betty_jvp, betty_get_grads
        patches = [(bh.jvp_fn_mapping, "neumann", jvp), (bp, "get_grads", get_grads)]
    try:
        yield counts
    finally:
        implicit.neumann.vjp = original
        for target, name, value in patches:
            if isinstance(target, dict):
                target[name] = value
            else:
                setattr(target, name, value)


def mloc_hypergrad(hier):
    return hier.hypergrad(TOP, accumulate=False)[0].detach().clone()


def betty_hypergrad(problems):
    """What ``one_step_descent`` puts into λ's ``.grad`` before the optimizer step."""
    top = problems[TOP]
    loss, _ = top.get_loss(())
    top.backward(loss=loss, params=top.trainable_parameters(), paths=top.paths,
                 create_graph=not top._first_order, retain_graph=top._retain_graph,
                 allow_unused=top._allow_unused)
    grad = top.module.theta.grad.detach().clone()
    top.zero_grad()
    return grad


def relative(a, b) -> float:
    return float((a - b).norm() / b.norm())


@dataclass
class Comparison:
    levels: int
    paths: int          # Betty's paths for the top (its ``get_grads`` calls per step)
    paths_listed: int   # len(top.paths) after Betty's parse_dependency
    mloc_vjps: int
    betty_vjps: int
    agreement: float    # max relative difference of λ's hypergradient at the first state
    mloc_grad: torch.Tensor
    betty_grad: torch.Tensor


def compare(lat: Lattice, iters: int = ITERS, alpha: float = ALPHA, systems=None) -> Comparison:
    """One untimed hypergradient of λ in each system at the first state, counted."""
    hier, mp = systems[0] if systems else mloc_system(lat, iters, alpha)
    _, bp = systems[1] if systems else betty_system(lat, iters, alpha)
    with counting() as counts:
        mg = mloc_hypergrad(hier)
        mloc_vjps = counts["mloc"]
        bg = betty_hypergrad(bp)
    return Comparison(lat.levels, counts["paths"], len(bp[TOP].paths), mloc_vjps, counts["betty"],
                      relative(mg, bg), mg, bg)


# --- timing ------------------------------------------------------------------------------
def measure(steps: dict, reps: int, warmup: int, rng: random.Random) -> dict:
    """Median ms per step of each system, ``{"cpu": {...}, "wall": {...}}``."""
    cpu, wall = {k: [] for k in steps}, {k: [] for k in steps}
    names = list(steps)
    for _ in range(warmup):
        for k in names:
            steps[k]()
    for _ in range(reps):
        rng.shuffle(names)
        for k in names:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            steps[k]()
            c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
            cpu[k].append(c1 - c0)
            wall[k].append(t1 - t0)
    return {clock: {k: statistics.median(v) / 1e6 for k, v in d.items()}
            for clock, d in (("cpu", cpu), ("wall", wall))}


def run_level(levels: int, args, rng: random.Random) -> dict:
    lat = Lattice(levels, args.dim)
    mloc, betty = mloc_system(lat, args.iters, args.alpha), betty_system(lat, args.iters, args.alpha)
    comparison = compare(lat, args.iters, args.alpha, systems=(mloc, betty))
    medians = measure({"mloc": lambda: mloc_step(*mloc), "betty": lambda: betty_step(betty[1])},
                      args.reps, args.warmup, rng)
    after = relative(mloc[1][TOP].params[0].detach(), betty[1][TOP].module.theta.detach())
    return dict(c=comparison, med=medians, after=after, steps=args.reps + args.warmup)


def report(rows, args):
    print(f"Top problem's step, median ms over {args.reps} steps after {args.warmup} "
          f"(thread CPU time; one thread), d = {args.dim}, neumann K = {args.iters}, "
          f"α = {args.alpha}, float64:")
    print()
    print("| levels | paths (Betty) | BR-VJPs mloc / Betty | ms mloc / Betty | mloc/Betty | "
          "agreement | wall ms mloc / Betty | wall mloc/Betty |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, cpu, wall = r["c"], r["med"]["cpu"], r["med"]["wall"]
        print(f"| {c.levels} | {c.paths} | {c.mloc_vjps} / {c.betty_vjps} | "
              f"{cpu['mloc']:.3f} / {cpu['betty']:.3f} | {cpu['mloc'] / cpu['betty']:.3f} | "
              f"{c.agreement:.1e} | {wall['mloc']:.3f} / {wall['betty']:.3f} | "
              f"{wall['mloc'] / wall['betty']:.3f} |")
    print()
    print("agreement: max relative difference of λ's hypergradient at the first state; λ after "
          "all steps, mloc vs Betty: " + ", ".join(f"{r['c'].levels} levels {r['after']:.1e}" for r in rows))
    met = all(r["med"]["cpu"]["mloc"] * 2 <= r["med"]["cpu"]["betty"] for r in rows if r["c"].levels >= 4)
    print(f"target ≥ 2 × faster than Betty from 4 levels: {'met' if met else 'NOT met'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="3,4,5,6", help="comma list of lattice depths (≥ 3)")
    parser.add_argument("--reps", type=int, default=200, help="timed steps per system and depth")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per system first")
    parser.add_argument("--dim", type=int, default=DIM, help="dimension of every parameter vector")
    parser.add_argument("--iters", type=int, default=ITERS, help="Neumann terms K (both systems)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="Neumann step α (both systems)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        import betty  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"Betty is not installed ({e}); bench/README.md says how to install it "
                         "for benchmarks (never a dependency of mloc)")
    rng = random.Random(0)
    rows = [run_level(int(n), args, rng) for n in args.levels.split(",")]
    report(rows, args)


if __name__ == "__main__":
    main()
