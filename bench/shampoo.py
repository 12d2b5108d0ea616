"""Shampoo against Adam and against pytorch-optimizer 4.1.0's Shampoo, side by side.

Two full-batch problems, float32, one CPU thread (or ``--device cuda``):

- ``logreg``: 10-class logistic regression, 2000 examples, 50 features whose scales span
  1e-2 … 1e1 (condition number of the feature covariance ~1e6), weight 10×50 + bias;
- ``mlp``: 64 → 128 → 10 tanh MLP on 2000 examples of a fixed random teacher network,
  inputs scaled as above.

Measured: step times, the optimizers interleaved run by run, ``--runs`` runs of 100 steps
each, every phase of the 10-step root cycle by its median (:func:`amortised`), for the
optimizer step alone and for the whole training step (forward, backward, step):

- mloc ``adam``;
- mloc ``shampoo`` (AdaGrad grafting, Nesterov momentum 0.9, roots every 10 steps,
  preconditioning from step 11; ``root_method="auto"``, eigh on the CPU), synchronous;
- the same with ``async_roots`` and ``staleness=10`` (the roots computed in a worker
  process during the next cycle, :mod:`mloc.runtime.optim.rootjobs`; its start-up, about a
  second once per run, is waited for before the first step);
- mloc ``shampoo`` with ``pytorch_optimizer.Shampoo``'s settings (no grafting, no momentum,
  roots every 10 steps), with ``auto`` roots and with coupled Newton, and
  ``pytorch_optimizer.Shampoo(momentum=0, preconditioning_compute_steps=10)`` (4.1.0);
- each also between root refreshes (:func:`between_refreshes`): the steps on which no
  root is computed or installed, the floor that asynchronous roots can approach;
- two floors (:class:`Products`): Shampoo's four matrix products per weight and step
  alone, which any implementation computes every step (two for the statistics, two to
  precondition); and the same with the roots every 10 steps (synchronous, as ``auto``
  computes them: float64 eigendecompositions on the CPU, coupled Newton on CUDA);
- a minimal step (:class:`Minimal`): the default Shampoo's whole step between refreshes,
  hand-written with the fewest operations we found (one flat buffer for the elementwise
  work), no root work: the same computation as mloc's (a test in ``tests/shampoo`` says
  so), timed the same way; what a leaner implementation of the same step would cost.

Steps to Adam's 500-step loss are ``bench/shampoo_tuning.py``'s (same problems, a common
learning-rate grid widened until no best rate is at an edge).

    python bench/shampoo.py [--runs 3] [--threads 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mloc.runtime.optim import adam, blocks, shampoo
from mloc.runtime.optim.shampoo import Shampoo
from mloc.runtime.optim.rootbatch import RootBatch

EVERY = 10
"""Steps between root refreshes in every Shampoo configuration here (the issue's setting)."""


DEVICE = torch.device("cpu")
"""Where the problems and the optimizers run (``--device``; the data are drawn on the CPU
and moved, so every device trains on the same numbers)."""


def clock() -> float:
    """``time.perf_counter()`` once the device's queued work is done (on CUDA, kernels run
    asynchronously: without the synchronization a step would time its launches only)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return time.perf_counter()


def on_device(*tensors):
    return tuple(t.to(DEVICE) for t in tensors)


def scaled_inputs(gen, n, d):
    x = torch.randn(n, d, generator=gen)
    return x * torch.logspace(-2, 1, d)


def logreg():
    gen = torch.Generator().manual_seed(0)
    x = scaled_inputs(gen, 2000, 50)
    w = torch.randn(10, 50, generator=gen) / torch.logspace(-2, 1, 50)
    y = (x @ w.T + 0.5 * torch.randn(2000, 10, generator=gen)).argmax(1)
    x, y = on_device(x, y)
    params = on_device(torch.zeros(10, 50), torch.zeros(10))

    def loss(p):
        return torch.nn.functional.cross_entropy(x @ p[0].T + p[1], y)
    return params, loss


def mlp():
    gen = torch.Generator().manual_seed(1)
    x = scaled_inputs(gen, 2000, 64)
    teacher = torch.randn(10, 64, generator=gen) / torch.logspace(-2, 1, 64)
    y = torch.tanh(x @ teacher.T).argmax(1)
    x, y = on_device(x, y)
    params = on_device(torch.randn(128, 64, generator=gen) / 8, torch.zeros(128),
                       torch.randn(10, 128, generator=gen) / 11, torch.zeros(10))

    def loss(p):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ p[0].T + p[1]) @ p[2].T + p[3], y)
    return params, loss


PROBLEMS = {"logreg": logreg, "mlp": mlp}


class Products:
    """A floor for any Shampoo on these problems: the four matrix products per weight matrix
    and step alone (the statistics' ``G Gᵀ`` and ``Gᵀ G`` accumulated, and ``Q₁ G Q₂`` with
    fixed roots), by mloc's own ``blocks.accumulate`` and ``blocks.precondition``;
    no grafting, momentum or update. Every weight here is one block (≤ 128). With
    ``roots``, also the inverse 4th roots of the statistics every ``EVERY`` steps, computed
    synchronously as mloc's ``auto`` does on the CPU (one float64 eigendecomposition each,
    batched by size: ``RootBatch.compute``), and not used."""

    def __init__(self, roots=False):
        self.work = RootBatch(1e-6, "auto") if roots else None
        self.t = 0

    def start(self):
        pass

    def close(self):
        pass

    def init(self, params):
        def zeros(n):
            return torch.zeros(1, n, n, device=DEVICE)

        def eye(n):
            return torch.eye(n, device=DEVICE).unsqueeze(0)
        return [(zeros(m), zeros(n), eye(m), eye(n)) for m, n in (p.shape for p in params if p.dim() == 2)]

    def commit(self, grads, state, params):
        for g, (left, right, q1, q2) in zip([g for g in grads if g.dim() == 2], state):
            x = g.unsqueeze(0)                  # one block: blocks.to_blocks' view
            blocks.accumulate((left, right), x, 1.0, inplace=True)
            blocks.precondition(x, [q1, q2])
        self.t += 1
        if self.work is not None and self.t % EVERY == 0:
            self.work.compute(tuple((left, right) for left, right, _, _ in state), (4,) * len(state))
        return state


class Minimal:
    """What a leaner implementation of mloc's default Shampoo step between root refreshes
    would cost: the same formulas (AdaGrad grafting, Nesterov momentum 0.9, both statistics
    accumulated, ``Q₁ G Q₂`` with fixed roots, rescaled to the graft's norm) written by hand
    with the fewest operations we found: the elementwise work on one flat buffer of all
    parameters (one kernel per formula instead of one per tensor), no root work, no
    bookkeeping, no state object. Not an optimizer mloc offers: it never refreshes a root."""

    def start(self):
        pass

    def close(self):
        pass

    def init(self, params):
        sizes = [p.numel() for p in params]
        offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        n, like = offsets[-1], dict(device=params[0].device, dtype=params[0].dtype)
        mats = [(offsets[i], offsets[i + 1], tuple(p.shape)) for i, p in enumerate(params) if p.dim() == 2]
        factors = [tuple(torch.zeros(1, d, d, **like) for d in shape) for _, _, shape in mats]
        roots = [tuple(torch.eye(d, **like).unsqueeze(0) for d in shape) for _, _, shape in mats]
        return {"v": torch.zeros(n, **like), "b": torch.zeros(n, **like), "sizes": sizes,
                "mats": mats, "factors": factors, "roots": roots}

    def commit(self, grads, state, params, lr=1e-2, mu=0.9):
        g = torch.cat([x.reshape(-1) for x in grads])
        state["v"].addcmul_(g, g)
        d = g / state["v"].sqrt().add_(1e-10)
        pre, graft = [], []
        for (lo, hi, shape), (left, right), (q1, q2) in zip(state["mats"], state["factors"], state["roots"]):
            x = g[lo:hi].view(1, *shape)
            left.baddbmm_(x, x.transpose(-2, -1))
            right.baddbmm_(x.transpose(-2, -1), x)
            pre.append(torch.bmm(torch.bmm(q1, x), q2))
            graft.append(d[lo:hi].view(1, *shape))
        norms = torch._foreach_norm(pre + graft)
        scale = torch._foreach_div(norms[len(pre):], torch._foreach_add(norms[:len(pre)], 1e-16))
        for p, s, out in zip(pre, scale, graft):
            torch.mul(p, s, out=out)                      # written into d's slice
        state["b"] = torch.add(d, state["b"], alpha=mu)
        step = torch.add(d, state["b"], alpha=mu)
        torch._foreach_add_(list(params), [s.view_as(p) for s, p in zip(step.split(state["sizes"]), params)],
                            alpha=-lr)
        return state


def make(name, lr):
    if name == "minimal":
        return Minimal()
    if name in ("products", "products_roots"):
        return Products(roots=name == "products_roots")
    if name == "adam":
        return adam(lr)
    if name == "shampoo":
        return shampoo(lr, update_every=EVERY, start_preconditioning_step=10, graft="adagrad")
    if name == "shampoo_p2":      # exponent -1/2 per side instead of -1/4
        return shampoo(lr, update_every=10, start_preconditioning_step=10, graft="adagrad",
                       exponent_override=2)
    if name == "shampoo_async":   # the same, roots on a background thread, used one cycle later
        return shampoo(lr, update_every=EVERY, start_preconditioning_step=10, graft="adagrad",
                       staleness=EVERY, async_roots=True)
    if name in ("shampoo_matched", "shampoo_matched_newton"):    # pytorch-optimizer's settings
        return shampoo(lr, momentum=0.0, update_every=EVERY, start_preconditioning_step=0, graft="none",
                       epsilon=1e-6, root_method="newton" if name.endswith("newton") else "auto")
    raise ValueError(name)


def train(problem, opt_name, lr, steps, time_step=False, **kw):
    """``(losses, step_times)``: ``losses[k]`` the loss after ``k`` steps (``k = 0 … steps``),
    and the seconds of each optimizer step (with ``time_step``: of each whole training
    step, forward and backward included)."""
    init, loss_fn = PROBLEMS[problem]()
    params = tuple(p.clone().requires_grad_(True) for p in init)
    losses, times = [], []
    if opt_name == "po_shampoo":
        import pytorch_optimizer
        opt = pytorch_optimizer.Shampoo(params, lr=lr, momentum=0.0, preconditioning_compute_steps=EVERY)
        for _ in range(steps):
            t_step = clock()
            opt.zero_grad()
            loss = loss_fn(params)
            loss.backward()
            losses.append(loss.item())
            t0 = clock()
            opt.step()
            times.append(clock() - (t_step if time_step else t0))
        return losses + [loss_fn(params).item()], times
    opt = kw.pop("opt", None) or make(opt_name, lr)
    opt.start()
    if isinstance(opt, Shampoo):    # async roots: the worker process's start-up (~1 s) is not a step
        opt.work.jobs.ready(60)
    state = opt.init(params)
    for _ in range(steps):
        t_step = clock()
        loss = loss_fn(params)
        grads = torch.autograd.grad(loss, params)
        losses.append(loss.item())
        t0 = clock()
        with torch.no_grad():
            state = opt.commit(grads, state, params)
        times.append(clock() - (t_step if time_step else t0))
    opt.close()
    with torch.no_grad():
        return losses + [loss_fn(params).item()], times


TIMED = ("adam", "shampoo", "shampoo_async", "shampoo_matched", "shampoo_matched_newton", "po_shampoo",
         "products", "products_roots", "minimal")


def phase_medians(runs, every=EVERY, skip=2 * EVERY):
    """Per phase ``k`` of the ``every``-step root cycle (steps ``t ≡ k+1 mod every``; the
    last phase is the refresh step), the median step time over all ``runs`` (lists of step
    times), each after its first ``skip`` steps: robust to a busy machine's outliers."""
    return [statistics.median(t for times in runs for i, t in enumerate(times) if i >= skip and i % every == k)
            for k in range(every)]


def amortised(runs, every=EVERY, skip=2 * EVERY):
    """The mean time per step over a cycle of ``every`` steps, each phase by its median
    (:func:`phase_medians`): the root refresh (one phase) counts once per cycle."""
    return statistics.fmean(phase_medians(runs, every, skip))


def between_refreshes(runs, every=EVERY, skip=2 * EVERY):
    """The median of the phases without a root refresh (:func:`phase_medians` but the
    last): what a step costs when the roots cost nothing on it, the floor of asynchronous
    roots."""
    return statistics.median(phase_medians(runs, every, skip)[:-1])


def step_times(problem, runs, steps=100, time_step=False):
    """Per optimizer of ``TIMED``, ``(amortised, between refreshes)`` step times
    (:func:`amortised`, :func:`between_refreshes`) over ``runs`` runs of ``steps`` steps,
    the optimizers interleaved run by run."""
    times = {name: [] for name in TIMED}
    for _ in range(runs):
        for name in TIMED:
            times[name].append(train(problem, name, 1e-2, steps, time_step=time_step)[1])
    return {name: (amortised(r), between_refreshes(r)) for name, r in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (roots: eigh on the CPU, Newton on CUDA)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/shampoo.py: --device cuda, but this torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}, {torch.get_num_threads()} thread(s), "
          f"{args.runs} runs of 100 steps\n")
    names = {"adam": "Adam", "shampoo": "Shampoo", "shampoo_async": "Shampoo, async roots",
             "shampoo_matched": "matched (eigh)", "shampoo_matched_newton": "matched (Newton)",
             "po_shampoo": "pytorch-optimizer Shampoo", "products": "floor: the four products",
             "products_roots": "floor: products and roots", "minimal": "a minimal step (hand-written)"}
    for what, time_step in (("optimizer step alone", False), ("whole training step (forward, backward, "
                                                                "optimizer)", True)):
        measured = {problem: step_times(problem, args.runs, time_step=time_step) for problem in PROBLEMS}
        for j, how in enumerate(("amortised over the 10-step root cycle",
                                 "between root refreshes (the median of the 9 phases without one)")):
            print(f"{what}, ms, {how} (x Adam):\n")
            print("| problem | " + " | ".join(names[n] for n in TIMED) + " |")
            print("|---|" + "---|" * len(TIMED))
            for problem, t in measured.items():
                print(f"| {problem} | " + " | ".join(f"{t[n][j]*1e3:.3f} ({t[n][j]/t['adam'][j]:.2f})"
                                                     for n in TIMED) + " |")
            print()

if __name__ == "__main__":
    main()
