"""programs/darts.mlo under mloc and the same search written for Betty 0.2.1 (``darts``).

    python3 bench/darts_vs_betty.py [--steps 40] [--warmup 5]

Betty's ``darts`` hypergradient and mloc's ``finite_diff`` are the same method: the
identity-Hessian implicit hypergradient with the mixed product by central differences at
α ± εv, ε = 0.01/‖v‖ (DARTS' second-order approximation with ξ = 1: the program's edge is
set to ``finite_diff(eps=0.01)``, ξ = 1, where the program as written takes ξ = 0.05). Both systems get the
program's modules (:class:`darts.Network`, :class:`darts.Architecture`), losses
(:func:`darts.ce`) and batches (the same seeded loaders); Betty's problems are two
``ImplicitProblem``s in an ``Engine`` (``u2l``/``l2u`` between them), stepped by
``engine.train_step()``.

1. **First-step agreement, float64.** Both start from mloc's initial modules (copied), the
   network's SGD as in the program (lr 0.05, momentum 0.9, weight decay 3e-4) and α's
   optimizer replaced by plain SGD with lr 1 (mloc: ``--set arch.optimizer=sgd(lr=1.0)``),
   so that one outer step moves α by minus its hypergradient: α₀ − α₁ is each system's
   first hypergradient. Also compared: the network's weights after the step, and its
   BatchNorm running means, which Betty's finite-difference and upper-level passes update
   too (they run the network in training mode on α ± εv and on the validation batch), and
   mloc leaves to the network's own training step.
2. **Time per outer step, float32**, the program as written (Adam on α, cosine rate on the
   network): both systems stepped side by side in one process, one thread, in a fresh
   random order each round; the median of the thread's CPU time per outer step (the wall
   clock on a shared machine counts other jobs' time) and of the wall time; and the peak
   bytes of CPU tensor memory one outer step allocates and holds at once (the allocator's
   own events, as ``bench/run_vs_betty.py`` measures them: median of 5 steps after one).

Betty is an optional benchmark dependency (never mloc's): ``pip download --no-deps
--ignore-requires-python betty-ml==0.2.1`` then ``pip install --no-deps
--ignore-requires-python <wheel> numpy``.
"""

from __future__ import annotations

import argparse
import copy
import logging
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "programs"))
sys.path.insert(0, str(ROOT / "bench"))

import darts as lib  # noqa: E402
import mloc  # noqa: E402
from run_vs_betty import steady_peak  # noqa: E402
from synthetic import loader  # noqa: E402

PROGRAM = ROOT / "programs" / "darts.mlo"
XI_1 = "arch->net.hypergrad=finite_diff(eps=0.01)"      # Betty's darts: ξ = 1


def batches(split: str, seed: int, dtype: torch.dtype):
    """The program's loader for ``split`` (same batches, same order), cast to ``dtype``."""
    x, y = lib.split(split)
    return loader(x.to(dtype), y, 64, seed=seed)


def betty_program(net, arch, dtype, upper_optimizer: str, steps: int):
    """Betty's version of programs/darts.mlo around copies of ``net`` and ``arch``."""
    from betty.configs import Config, EngineConfig
    from betty.engine import Engine
    from betty.logging.logger_base import get_logger
    from betty.problems import ImplicitProblem

    get_logger().setLevel(logging.WARNING)

    class Net(ImplicitProblem):
        def training_step(self, batch):
            return lib.ce(self.module, self.arch.module, batch)

    class Arch(ImplicitProblem):
        def training_step(self, batch):
            return lib.ce(self.net.module, self.module, batch)

    net, arch = copy.deepcopy(net), copy.deepcopy(arch)
    w_opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=3e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(w_opt, T_max=steps)
    a_opt = (torch.optim.SGD(arch.parameters(), lr=1.0) if upper_optimizer == "sgd" else
             torch.optim.Adam(arch.parameters(), lr=3e-3, betas=(0.5, 0.999), weight_decay=1e-3))
    lower = Net(name="net", module=net, optimizer=w_opt, scheduler=sched,
                config=Config(type="darts", darts_alpha=0.01, unroll_steps=1),
                train_data_loader=batches("search_train", 1, dtype))
    upper = Arch(name="arch", module=arch, optimizer=a_opt, config=Config(retain_graph=True),   # α read directly too
                 train_data_loader=batches("search_val", 2, dtype))
    engine = Engine(problems=[upper, lower], config=EngineConfig(train_iters=10**9, strategy="cpu", logger_type="none"),
                    dependencies={"u2l": {upper: [lower]}, "l2u": {lower: [upper]}})
    engine.train()

    def outer_step():
        engine.global_step += 1
        engine.train_step()
    return outer_step, net, arch


def running_means(net) -> torch.Tensor:
    return torch.cat([m.running_mean.flatten() for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def agreement() -> dict:
    """First-step hypergradients (α₀ − α₁ under SGD lr 1), weights and BN means, float64."""
    prog = mloc.load(PROGRAM, set=["arch.optimizer=sgd(lr=1.0)", XI_1], dtype="float64")
    net0, arch0 = copy.deepcopy(prog.module("net")), copy.deepcopy(prog.module("arch"))
    betty_step, b_net, b_arch = betty_program(net0, arch0, torch.float64, "sgd", steps=200)
    prog.step()
    betty_step()
    m_net, m_arch = prog.module("net"), prog.module("arch")
    g_m, g_b = arch0.alpha.detach() - m_arch.alpha.detach(), arch0.alpha.detach() - b_arch.alpha.detach()
    w_m = torch.cat([p.detach().flatten() for p in m_net.parameters()])
    w_b = torch.cat([p.detach().flatten() for p in b_net.parameters()])
    # the BN means one training step of the network alone gives (what mloc's should be)
    alone = copy.deepcopy(net0).train()
    alone(next(iter(batches("search_train", 1, torch.float64)))[0], arch0())
    return dict(hyper_norm=float(g_m.norm()), hyper_rel=rel(g_b, g_m), hyper_max=float((g_b - g_m).abs().max()),
                weights_rel=rel(w_b, w_m), bn_mloc_vs_alone=rel(running_means(m_net), running_means(alone)),
                bn_betty_vs_alone=rel(running_means(b_net), running_means(alone)))


def interleaved_medians(systems: dict, steps: int, warmup: int) -> dict:
    """``{"cpu": {name: ms}, "wall": {name: ms}}``: the median thread-CPU and wall
    milliseconds of each ``systems[name]()``, called in a shuffled order (seeded) every
    round, ``warmup`` rounds untimed, then ``steps`` timed."""
    cpu = {k: [] for k in systems}
    wall = {k: [] for k in systems}
    names, rng = list(systems), random.Random(0)
    for i in range(warmup + steps):
        rng.shuffle(names)
        for k in names:
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            systems[k]()
            c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
            if i >= warmup:
                cpu[k].append((c1 - c0) / 1e6)
                wall[k].append((t1 - t0) / 1e6)
    return {clock: {k: statistics.median(v) for k, v in d.items()} for clock, d in (("cpu", cpu), ("wall", wall))}


def timing(steps: int, warmup: int) -> dict:
    """Median ms per outer step (thread CPU time and wall time), float32, interleaved."""
    prog = mloc.load(PROGRAM, set=[XI_1])
    betty_step, _, _ = betty_program(prog.module("net"), prog.module("arch"), torch.float32, "adam", steps=200)
    systems = {"mloc": prog.step, "betty": betty_step}
    medians = interleaved_medians(systems, steps, warmup)
    medians["peak MiB"] = {k: steady_peak(step) / 2**20 for k, step in systems.items()}
    return medians


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    try:
        import betty  # noqa: F401
    except ImportError as e:
        print(f"Betty is not installed ({e}); see this file's docstring", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    a = agreement()
    print(f"torch {torch.__version__}, 1 thread")
    print()
    print("first outer step, float64, finite_diff / darts (eps 0.01), α's optimizer SGD lr 1:")
    print()
    print("| quantity | value |")
    print("|---|---|")
    print(f"| ‖hypergradient‖ (mloc) | {a['hyper_norm']:.4g} |")
    print(f"| Betty vs mloc hypergradient, relative ‖·‖ | {a['hyper_rel']:.2e} (max abs {a['hyper_max']:.2e}) |")
    print(f"| Betty vs mloc network weights after the step, relative | {a['weights_rel']:.2e} |")
    print(f"| BN running means vs one plain training step: mloc | {a['bn_mloc_vs_alone']:.2e} |")
    print(f"| BN running means vs one plain training step: Betty | {a['bn_betty_vs_alone']:.2e} |")
    t = timing(args.steps, args.warmup)
    print()
    print(f"float32, {args.steps} steps after {args.warmup}, medians:")
    print()
    print("| per outer step | mloc | Betty | mloc/Betty |")
    print("|---|---|---|---|")
    for what, d in t.items():
        label = {"cpu": "thread CPU ms", "wall": "wall ms"}.get(what, what)
        print(f"| {label} | {d['mloc']:.1f} | {d['betty']:.1f} | {d['mloc'] / d['betty']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
