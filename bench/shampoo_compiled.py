"""Shampoo's optimizer step compiled (``Optimizer.compiled_commit``) against its eager step
and against Adam, eager and compiled, side by side.

Two tanh MLPs trained on a fixed random teacher's labels, float32 on the CPU: ``64-256-10``
(batch 100) and ``256-2048-10`` (batch 512). Only the optimizer step is timed (the
gradients of each step are those of the optimizer's own trajectory, computed outside the
clock). Shampoo: AdaGrad grafting, Nesterov momentum 0.9, roots every 10 steps
(synchronous, staleness 0, eigh on the CPU), preconditioning from step 11, block size 128
(the 2048×256 weight is 16×2 blocks); Adam: lr 1e-3. A floor beside them: Shampoo's four
matrix products per weight alone (:class:`Products`), what any Shampoo computes every step
and what the compiler leaves as it is.

Per thread setting (``--threads``: 1, and 0 for torch's default, all cores), ``--runs``
runs; in each run the four optimizers train side by side, ``--steps`` steps, taking turns
in a fresh random order at every step (a busy machine slows them alike), each from a fresh
optimizer, so every run compiles anew (the first run of a process pays the cold compile,
later runs find Inductor's graph cache). A step's time is the median over runs and over
the steps outside the refresh phase of the 10-step root cycle, from step 21 on: the step
**between root refreshes** (the refresh itself, eigendecompositions, is eager in both).
Printed: ms per step, the ratio to eager Adam, and per compiled optimizer the compile
time of the first run (and the median of the later runs), graphs compiled per run and
graphs compiled after step 2 (recompiles in steady state: 0).

    python bench/shampoo_compiled.py [--runs 5] [--steps 60] [--threads 1,0] [--cold]

``--cold`` points Inductor at a fresh cache directory, so the first run's compile is a
true first compile (otherwise an earlier process's cache may serve it).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

EVERY = 10
MODELS = {"64-256-10": (64, 256, 10, 100), "256-2048-10": (256, 2048, 10, 512)}
VARIANTS = ("adam eager", "adam compiled", "shampoo eager", "shampoo compiled", "shampoo products")


def problem(sizes):
    import torch
    d, h, k, n = sizes
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen)
    y = torch.tanh(x @ torch.randn(d, k, generator=gen)).argmax(1)
    init = (torch.randn(h, d, generator=gen) / d ** 0.5, torch.zeros(h),
            torch.randn(k, h, generator=gen) / h ** 0.5, torch.zeros(k))

    def loss(p):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ p[0].T + p[1]) @ p[2].T + p[3], y)
    return init, loss


def make(variant):
    from mloc.runtime.optim import adam, shampoo
    if variant.startswith("adam"):
        return adam(1e-3)
    if variant == "shampoo products":
        return Products()
    return shampoo(1e-3, update_every=EVERY, start_preconditioning_step=EVERY, graft="adagrad")


class Products:
    """A floor: Shampoo's four matrix products per weight and step alone, on its own
    blocked layouts (the statistics accumulated in place, ``Q₁ G Q₂`` with its roots: mloc's
    ``blocks.accumulate`` and ``blocks.precondition``), nothing else, never a root."""

    def __init__(self):
        self.opt = make("shampoo eager")

    def init(self, params):
        self.lays = [self.opt.layout(p) for p in params]
        return self.opt.init(params)

    def commit(self, grads, state, params):
        from mloc.runtime.optim import blocks
        for g, stats, roots, lay in zip(grads, state.stats, state.roots, self.lays):
            if stats:
                x = blocks.to_blocks(g, lay)
                blocks.accumulate(stats, x, 1.0, inplace=True)
                blocks.precondition(x, list(roots))
        return state


class Trainer:
    """One optimizer training its own copy of the model: ``step()`` computes the
    gradients at its parameters (untimed) and returns the seconds of the commit alone."""

    def __init__(self, sizes, variant):
        import torch
        init, self.loss = problem(sizes)
        self.params = tuple(p.clone().requires_grad_(True) for p in init)
        self.opt = make(variant)
        self.state = self.opt.init(self.params)
        self.compiled = variant.endswith("compiled")
        self.commit = self.opt.compiled_commit() if self.compiled else self.opt.commit
        self.torch = torch

    def step(self) -> tuple[float, float]:
        """``(wall s, CPU s of this thread)`` of one commit."""
        grads = self.torch.autograd.grad(self.loss(self.params), self.params)
        c0, t0 = time.thread_time(), time.perf_counter()
        with self.torch.no_grad():
            self.state = self.commit(grads, self.state, self.params)
        return time.perf_counter() - t0, time.thread_time() - c0


def one_run(sizes, steps, rng):
    """Per variant, the step times of one run (``(wall, CPU)`` pairs): the four trainers
    step in turn, in a fresh random order at every step (so a busy machine slows them
    alike); and per compiled variant ``(compile s, graphs, graphs after step 2)``."""
    trainers = {v: Trainer(sizes, v) for v in VARIANTS}
    times = {v: [] for v in VARIANTS}
    at_2 = {}
    for step in range(steps):
        order = list(VARIANTS)
        rng.shuffle(order)
        for v in order:
            times[v].append(trainers[v].step())
        if step == 1:
            at_2 = {v: t.commit.compiles for v, t in trainers.items() if t.compiled}
    compiles = {}
    for v, t in trainers.items():
        if t.compiled:
            if t.commit.reason is not None:
                raise SystemExit(f"{v}: not compiled: {t.commit.reason}")
            compiles[v] = (t.commit.compile_seconds, t.commit.compiles, t.commit.compiles - at_2[v])
    return times, compiles


def between_refreshes(runs, which=0, every=EVERY, skip=2 * EVERY):
    """The median over runs and steps of the step times (``which``: 0 wall, 1 CPU) outside
    the refresh phase (steps ``t`` with ``t % every != 0``), after the first ``skip``
    steps."""
    return statistics.median(t[which] for times in runs for i, t in enumerate(times)
                             if i >= skip and (i + 1) % every != 0)


def measure(threads, runs, steps):
    import torch
    torch.set_num_threads(threads or os.cpu_count() or 1)
    rng = random.Random(threads)
    out = {}
    for model, sizes in MODELS.items():
        times = {v: [] for v in VARIANTS}
        compiles = {v: [] for v in VARIANTS if v.endswith("compiled")}
        for _ in range(runs):
            t, c = one_run(sizes, steps, rng)
            for v in VARIANTS:
                times[v].append(t[v])
            for v in compiles:
                compiles[v].append(c[v])
        out[model] = ({v: between_refreshes(r) for v, r in times.items()},
                      {v: between_refreshes(r, 1) for v, r in times.items()}, compiles)
    return torch.get_num_threads(), out


def report(threads, out):
    tables = [("wall", 0)] + ([("CPU time of the thread (time it was descheduled left out)", 1)]
                              if threads == 1 else [])
    for what, k in tables:
        print(f"{threads} thread(s): optimizer step between root refreshes, median ms, {what} "
              "(x eager Adam)\n")
        print("| model | " + " | ".join(VARIANTS) + " | shampoo compiled / eager |")
        print("|---|" + "---|" * (len(VARIANTS) + 1))
        for model, measured in out.items():
            t = measured[k]
            base = t["adam eager"]
            cells = " | ".join(f"{t[v] * 1e3:.3f} ({t[v] / base:.2f})" for v in VARIANTS)
            print(f"| {model} | {cells} | {t['shampoo compiled'] / t['shampoo eager']:.2f} |")
        print()
    print("compiles: first run's compile s (later runs' median s), graphs per run, graphs after step 2\n")
    print("| model | " + " | ".join(v for v in VARIANTS if v.endswith("compiled")) + " |")
    print("|---|---|---|")
    for model, (_, _, compiles) in out.items():
        cells = []
        for v, cs in compiles.items():
            later = f" ({statistics.median(c[0] for c in cs[1:]):.1f})" if len(cs) > 1 else ""
            cells.append(f"{cs[0][0]:.1f}{later} s, {max(c[1] for c in cs)} graph(s), "
                         f"{max(c[2] for c in cs)} after step 2")
        print(f"| {model} | " + " | ".join(cells) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", default="1,0", help="comma-separated; 0: torch's default (all cores)")
    ap.add_argument("--cold", action="store_true", help="a fresh Inductor cache directory")
    args = ap.parse_args()
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    import torch
    print(f"torch {torch.__version__}, CPU, {os.cpu_count()} cores (load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}), {args.runs} runs of {args.steps} "
          f"steps{', cold Inductor cache' if args.cold else ''}\n")
    for threads in (int(t) for t in args.threads.split(",")):
        report(*measure(threads, args.runs, args.steps))


if __name__ == "__main__":
    main()
