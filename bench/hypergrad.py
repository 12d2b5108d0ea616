"""Benchmark: one hypergradient step of each mloc.runtime method against hand-written PyTorch.

Meta-Weight-Net on synthetic data (shared/reference/peers.md): a 64-256-10 classifier with
SGD (lr 0.1) on 40%-noisy labels, a 1-100-1 sigmoid weight net with Adam (lr 1e-3) on a
500-example clean set, batch 100, one thread. One "hypergradient step" is everything from
the current parameters to the weight net's ``.grad``: the validation forward/backward,
the method's BR-VJP (for itd: its unrolled look-ahead steps) and the final backward.
Both versions run interleaved in one process, all steps in a fresh random order each
repetition; the table reports medians over many repetitions and their ratio.

Memory: the peak bytes of CPU tensor memory the step allocates and holds at once
(activations, saved tensors, Hessian-vector graphs, solver vectors), counted storage by
storage at every aten operation (``mloc.runtime.base.memory.PeakMemory``) in a separate,
untimed run; parameters and data that exist before the step are not counted.

    python3 bench/hypergrad.py [--reps 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hypergrad_hand as hand  # noqa: E402
from mloc.ir.composition import compositions_of  # noqa: E402
from mloc.runtime.base.memory import peak_bytes as _peak_bytes  # noqa: E402
from mloc.runtime import Edge, Hierarchy, Problem, adam, cg, finite_diff, itd, neumann, sama, sgd  # noqa: E402

LR = 0.1
CASES = [  # (label, runtime method, hand-written step or None)
    ("finite_diff (darts)", finite_diff(), hand.finite_diff),
    ("sama", sama(), hand.sama),
    ("neumann K=3 a=0.1", neumann(3, 0.1), hand.neumann),
    ("cg K=3", cg(3), hand.cg),
    ("itd 1 step", itd(1), hand.itd),
    ("itd 5 steps", itd(5), lambda *a: hand.itd(*a, steps=5)),
    ("itd 5 steps, truncate 2", itd(5, truncate=2), None),
    ("itd 5 steps, recompute", itd(5, mode="recompute"), None),
]


def params(*shapes, gen):
    return [(torch.randn(*s, generator=gen) * (1 / s[-1]) ** 0.5).requires_grad_() for s in shapes]


def mlp(p, x, act):
    return F.linear(act(F.linear(x, p[0], p[1])), p[2], p[3])


def setup(seed=0):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 64, generator=gen) * 2
    def data(n, noise):
        y = torch.randint(0, 10, (n,), generator=gen)
        x = centers[y] + torch.randn(n, 64, generator=gen)
        flip = torch.rand(n, generator=gen) < noise
        return x, torch.where(flip, torch.randint(0, 10, (n,), generator=gen), y)
    (x, y), (xv, yv) = data(100, 0.4), data(500, 0.0)
    xv, yv = xv[:100], yv[:100]  # one clean meta batch of 100 from the 500
    theta = params((256, 64), (256,), (10, 256), (10,), gen=gen)
    phi = params((100, 1), (100,), (1, 100), (1,), gen=gen)

    def inner(th, ph):
        losses = F.cross_entropy(mlp(th, x, F.relu), y, reduction="none")
        weights = torch.sigmoid(mlp(ph, losses.detach().unsqueeze(1), torch.relu)).squeeze(1)
        return (weights * losses).mean()

    def outer(th):
        return F.cross_entropy(mlp(th, xv, F.relu), yv)
    return theta, phi, inner, outer


def runtime_step(method, theta, phi, inner, outer):
    problems = [Problem("classifier", tuple(theta), inner, ("classifier", "weights"), sgd(LR)),
                Problem("weights", tuple(phi), outer, ("classifier",), adam(1e-3))]
    edges = [Edge("weights", "classifier", method)]
    hier = Hierarchy(problems, edges, compositions=compositions_of(problems, edges))
    return lambda: hier.hypergrad("weights")


def clock(fn, phi):
    for p in phi:
        p.grad = None
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def peak_bytes(fn) -> int:
    """Peak bytes of tensor memory allocated by ``fn`` and still live, over its run.

    Counted storage by storage at every aten operation (``mloc.runtime.base.memory``, the
    measurement the planner's estimates are checked against). Everything the step
    allocates counts: activations, tensors saved for backward, Hessian-vector graphs, the
    O(d) vectors of the solvers; tensors that existed before (parameters, data) do not.
    (``torch.profiler``'s allocator events, replayed here before, missed one 100×256
    activation of the second-order methods' backward: 0.10 MiB.)
    """
    return _peak_bytes(fn)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    theta, phi, inner, outer = setup()
    rows = []
    for label, method, hand_fn in CASES:
        ours = runtime_step(method, theta, phi, inner, outer)
        theirs = (lambda f=hand_fn: f(inner, outer, theta, phi, LR)) if hand_fn else None
        rows.append((label, ours, theirs, agreement(ours, theirs, phi)))
    times = {label: ([], []) for label, *_ in rows}
    jobs = [(label, slot, fn) for label, ours, theirs, _ in rows
            for slot, fn in ((0, ours), (1, theirs)) if fn is not None]
    order = random.Random(0)
    for rep in range(args.warmup + args.reps):
        order.shuffle(jobs)  # no function always runs after the same one
        for label, slot, fn in jobs:
            t = clock(fn, phi)
            if rep >= args.warmup:
                times[label][slot].append(t)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, {args.reps} reps, "
          "median ms per hypergradient step")
    print("| method | mloc.runtime ms | hand-written ms | ratio | peak MiB | hand peak MiB "
          "| rel. diff |")
    print("|---|---|---|---|---|---|---|")
    for label, ours, theirs, diff in rows:
        a = statistics.median(times[label][0])
        b = f"{statistics.median(times[label][1]):.3f}" if theirs else "n/a"
        ratio = f"{a / statistics.median(times[label][1]):.3f}" if theirs else "n/a"
        mem = f"{peak_bytes(ours) / 2**20:.2f}"
        mem_hand = f"{peak_bytes(theirs) / 2**20:.2f}" if theirs else "n/a"
        print(f"| {label} | {a:.3f} | {b} | {ratio} | {mem} | {mem_hand} | {diff} |")


def agreement(ours, theirs, phi):
    """Largest relative difference between the two hypergradients (a correctness check)."""
    if theirs is None:
        return "n/a"
    results = []
    for fn in (ours, theirs):
        for p in phi:
            p.grad = None
        fn()
        results.append(torch.cat([p.grad.reshape(-1) for p in phi]))
    diff = torch.linalg.vector_norm(results[0] - results[1]) / torch.linalg.vector_norm(results[1])
    return f"{float(diff):.1e}"


if __name__ == "__main__":
    main()
