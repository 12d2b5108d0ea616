"""The whole training step (gradient and optimizer update) compiled as one graph
(:class:`~mloc.runtime.compiled.fused.FusedStep`, what ``--compile on`` runs for a lower
or upper step) with Shampoo against Adam, and each against its eager step, side by side.

The models and Shampoo's settings are ``bench/shampoo_compiled.py``'s (tanh MLPs
``64-256-10``, batch 100, and ``256-2048-10``, batch 512, float32 on the CPU; AdaGrad
grafting, Nesterov 0.9, roots every 10 steps, eigh, preconditioning from step 11, block
size 128; Adam lr 1e-3). Variants, each training its own copy:

- ``adam eager``, ``shampoo eager``: ``torch.autograd.grad`` then ``Optimizer.commit``;
- ``adam fused``, ``shampoo fused``: the step's one graph (gradient and update; Shampoo's
  between root refreshes, :mod:`mloc.runtime.optim.shampoo_compiled`; on a refresh step
  its gradient graph and the compiled commit after it);
- ``shampoo apart``: what ``--compile on`` ran for Shampoo before: the gradient's graph,
  then the compiled commit (``Optimizer.compiled_commit``) as a second region.

Timed: the whole step (``FusedStep.__call__``, or gradient and commit), wall and thread
CPU. A step's time is the median over ``--runs`` runs and over the steps from 21 on outside
the refresh phase (``t % 10 != 0``). In each run the variants step in a fresh random order
at every step (a busy machine slows them alike), each built afresh (so each run compiles;
later runs find Inductor's cache). Also printed: graphs per run and graphs compiled after
step 21 (0 in steady state: the roots installed at steps 20, 30, … are inputs).

    python bench/shampoo_fused.py [--runs 3] [--steps 60] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shampoo_compiled import EVERY, MODELS, between_refreshes, problem  # noqa: E402

VARIANTS = ("adam eager", "adam fused", "shampoo eager", "shampoo fused", "shampoo apart")


class Problem:
    """What a fused step reads of a problem: its optimizer, state and parameters."""

    def __init__(self, optimizer, params):
        self.optimizer, self.params = optimizer, params
        self.state = optimizer.init(params)


def build(sizes, variant):
    """``(step, report)``: one training step of ``variant`` (module docstring) on its own
    copy of the model, and the compiled step's report (None when eager)."""
    import torch
    from mloc.runtime.compiled.fused import FusedStep
    from mloc.runtime.compiled.step import CompiledSource, StepReport
    from mloc.runtime.grad.commit import Fusion
    from mloc.runtime.optim import adam, shampoo

    init, loss = problem(sizes)
    params = tuple(p.clone().requires_grad_(True) for p in init)
    opt = (adam(1e-3) if variant.startswith("adam")
           else shampoo(1e-3, update_every=EVERY, start_preconditioning_step=EVERY, graft="adagrad"))
    prob = Problem(opt, params)
    commit = opt.compiled_commit() if not variant.endswith("eager") else opt.commit

    def source(seed=None):
        value = loss(params)
        return torch.autograd.grad(value, params), value.detach()

    def commit_step(grads):
        with torch.no_grad():
            prob.state = commit(grads, prob.state, params)

    if variant.endswith("eager"):
        return lambda: commit_step(source()[0]), None
    report = StepReport("lower", variant)
    inputs = lambda: [*__import__("mloc").runtime.base.tree.tensors(prob.state), *params]  # noqa: E731
    if variant.endswith("apart"):
        compiled = CompiledSource(source, inputs, tuple, report)
        return lambda: commit_step(compiled(None)[0]), report
    fusion = Fusion(lambda: None, commit_step, lambda grads, loss: None)
    fused = FusedStep(source, fusion, prob, inputs, tuple, report, lifted=[prob])
    return lambda: fused(None), report


def one_run(sizes, steps, rng):
    built = {v: build(sizes, v) for v in VARIANTS}
    times = {v: [] for v in VARIANTS}
    graphs_at = {}
    for step in range(steps):
        order = list(VARIANTS)
        rng.shuffle(order)
        for v in order:
            c0, t0 = time.thread_time(), time.perf_counter()
            built[v][0]()
            times[v].append((time.perf_counter() - t0, time.thread_time() - c0))
        if step == 2 * EVERY:
            graphs_at = {v: r.counts.compiles for v, (_, r) in built.items() if r is not None}
    graphs = {}
    for v, (_, r) in built.items():
        if r is not None:
            if r.reason is not None or ("fused" in v) != r.fused:
                raise SystemExit(f"{v}: {r.line()}")
            graphs[v] = (r.counts.compiles, r.counts.compiles - graphs_at[v], r.seconds)
    return times, graphs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} thread(s), load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.runs} runs of {args.steps} steps\n")
    print("whole training step between root refreshes, median ms, wall / thread CPU (x eager Adam, CPU)\n")
    print("| model | " + " | ".join(VARIANTS) + " | shampoo fused / eager | graphs (after step 21) |")
    print("|---|" + "---|" * (len(VARIANTS) + 2))
    rng = random.Random(0)
    for model in args.models.split(","):
        runs, graphs = {v: [] for v in VARIANTS}, {}
        for _ in range(args.runs):
            t, g = one_run(MODELS[model], args.steps, rng)
            for v in VARIANTS:
                runs[v].append(t[v])
            for v, x in g.items():
                graphs.setdefault(v, []).append(x)
        wall = {v: between_refreshes(r) for v, r in runs.items()}
        cpu = {v: between_refreshes(r, 1) for v, r in runs.items()}
        cells = " | ".join(f"{wall[v] * 1e3:.2f} / {cpu[v] * 1e3:.2f} ({cpu[v] / cpu['adam eager']:.2f})"
                           for v in VARIANTS)
        counts = ", ".join(f"{v.split()[0][0]}{v.split()[1][0]} {max(x[0] for x in g)} ({max(x[1] for x in g)})"
                           for v, g in graphs.items())
        print(f"| {model} | {cells} | {cpu['shampoo fused'] / cpu['shampoo eager']:.2f} | {counts} |")


if __name__ == "__main__":
    main()
