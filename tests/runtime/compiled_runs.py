"""Runs of an optimizer's eager and compiled commits on the same gradients, for
``test_compiled_commit``: the built-in optimizers' configurations (every registry entry,
with its defaults, plus variants), and the measure of agreement.

Open loop: every run commits the same sequence of gradients (drawn from a fixed seed per
step, independent of the parameters), so what is compared is the commit itself. With
gradients from a loss at the current parameters (closed loop) a Shampoo trajectory amplifies
any rounding difference: on a 64-256-10 MLP, lr 1e-2, the eager commit started from
parameters perturbed by one unit in the last place ends 100 steps later 1e-11 (float64) and
1e-3 (float32) away from the unperturbed run (Adam: 4e-15 and 1.5e-6), so a closed-loop
tolerance would measure the problem's conditioning, not the compiler.
"""

from __future__ import annotations

import torch

from mloc.builtins import OPTIMIZERS, REQUIRED
from mloc.runtime.base import tree
from mloc.shared.hyper import GRAFTS

SHAPES = [(6, 5), (5,), (3, 4, 2), (40, 7)]
"""A matrix, a bias, a 3-d tensor (merged to 3×8), and a matrix that Shampoo's ``block_size``
16 pads and splits into 3×1 blocks."""

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
"""Largest relative difference (per tensor, ``max|a−b| / max|a|``) between the eager and the
compiled commit after 100 steps: a few units in the last place per step, accumulated (the
compiler fuses, reassociates and contracts the elementwise formulas, and Adam's region runs
the functional formulas where the eager commit runs ``torch.optim``'s fused in-place
kernels). Measured over every configuration here: ≤ 2.4e-15 in float64 and ≤ 2.4e-7 in
float32, except AdamW's parameters, 6.3e-15 and 3.0e-6 (its decoupled decay,
``θ·(1−ηλ)`` then the step in place, is one update ``−ηλθ − η·m/d`` in the functional
form)."""

_SHAMPOO = dict(block_size=16, update_every=4, start_preconditioning_step=3, root_method="eigh")

VARIANTS = {
    "sgd-nesterov-wd": ("sgd", dict(momentum=0.9, nesterov=True, weight_decay=1e-2)),
    "sgd-momentum-dampening": ("sgd", dict(momentum=0.9, dampening=0.1)),
    "adam-wd": ("adam", dict(weight_decay=1e-2)),
    **{f"shampoo-{g}": ("shampoo", dict(_SHAMPOO, graft=g)) for g in GRAFTS},
    "shampoo-stale-coupled": ("shampoo", dict(_SHAMPOO, staleness=3, nesterov=False, weight_decay=1e-2,
                                              decoupled_weight_decay=False, graft="adam")),
    "shampoo-async": ("shampoo", dict(_SHAMPOO, staleness=4, async_roots=True)),
}


def configs() -> dict[str, tuple[str, dict]]:
    """Every runnable registry entry with its defaults (so that a new one is covered), and
    :data:`VARIANTS`."""
    every = {name: (name, {}) for name, d in OPTIMIZERS.items() if d.runtime is not None}
    return {**every, **VARIANTS}


def build(name: str, **kwargs):
    """The registry entry ``name`` built as a program would: its required hyperparameters
    (the rate) 0.05, ``kwargs`` for the rest."""
    d = OPTIMIZERS[name]
    required = {p.name: 0.05 for p in d.signature.params if p.default is REQUIRED}
    return d.load()(**{**required, **kwargs})


def parameters(dtype) -> list:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_(True) for s in SHAPES]


def gradients(step: int, dtype) -> tuple:
    gen = torch.Generator().manual_seed(1000 + step)
    return tuple(torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES)


def rates(step: int) -> float:
    """A schedule's rate at ``step``: different at every step."""
    return 0.05 * (1 + 0.5 * torch.cos(torch.tensor(step / 7.0)).item())


def run(opt, commit, dtype, steps=100, start=0, params=None, state=None, schedule=None, watch=None):
    """``(params, state)`` after committing steps ``start … steps-1``'s gradients with
    ``commit`` (from :func:`parameters` and ``opt.init``, or the ``params`` and ``state``
    given); ``schedule(rate)`` is called before each commit; ``watch(step, state, params)``
    after."""
    params = parameters(dtype) if params is None else params
    opt.start()
    try:
        state = opt.init(params) if state is None else state
        for step in range(start, steps):
            if schedule is not None:
                schedule(rates(step))
            with torch.no_grad():
                state = commit(gradients(step, dtype), state, params)
            if watch is not None:
                watch(step, state, params)
        opt.drain()
    finally:
        opt.close()
    return params, state


def floating(state) -> list:
    return [t for t in tree.tensors(state) if t.is_floating_point()]


def relative(a, b) -> float:
    """The largest per-tensor ``max|a−b| / max|a|`` over two lists of tensors."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        scale = x.detach().abs().max().clamp_min(torch.finfo(x.dtype).tiny)
        worst = max(worst, ((x.detach() - y.detach()).abs().max() / scale).item())
    return worst


def layout(state) -> object:
    """The state's structure as a checkpoint stores it: every tensor by shape and dtype."""
    return tree.map_tensors(tree.to_plain(state), lambda t: (tuple(t.shape), t.dtype))
