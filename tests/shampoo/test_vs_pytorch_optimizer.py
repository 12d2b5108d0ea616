"""mloc's Shampoo against PyPI ``pytorch-optimizer`` 4.1.0's ``Shampoo`` (an optional test
dependency: skipped when absent), 100 steps on a fixed small problem, float64.

Matched settings. ``pytorch_optimizer.Shampoo(lr, momentum=0, weight_decay,
weight_decouple, preconditioning_compute_steps=1, matrix_eps=0)``: running-sum statistics
per mode, roots ``(Σ G Gᵀ)^{-1/4}`` by SVD every step, ``Δθ = −η·L^{-1/4} G R^{-1/4}``.
mloc: ``shampoo(lr, beta2=1, momentum=0, graft="none", start_preconditioning_step=0,
update_every=1, block_size=64, epsilon=1e-12)`` with coupled or decoupled decay (both libraries'
decoupled decay is ``−η·wd·θ``).

What cannot be matched, and is avoided: its ``momentum`` blends the raw gradient with the
previous *preconditioned* direction before the statistics (a different algorithm), so
momentum is 0; its ridge is an absolute ``matrix_eps·I`` stored in the statistics while
mloc's is relative and never stored, so its ridge is 0 and mloc's 1e-12·λmax, and the
problem is chosen so every statistic is nonsingular from the first step (square 6×6
weights, batch 32: full-rank gradients); 1-D tensors, which it preconditions with a full
matrix and mloc with the grafted diagonal update, are absent (no biases); with roots
every k > 1 steps its roots are zero until step k (no update), mloc's the identity.
``ScalableShampoo`` is not compared: it adds weight decay to the preconditioned direction,
keeps a separate momentum for the graft, and its power iteration draws from the global RNG.

Tolerance: the parameters agree to 1e-8 relative after every one of the 100 steps, with
mloc's roots by coupled Newton (default tolerance 1e-10 on max|M−I|) and by
eigendecomposition alike; measured worst 2.0e-9 (no decay, decoupled) and 2.9e-10
(coupled), the same for both methods: the difference is mloc's ridge 1e-12·λmax, whose
effect on a root is about ε·κ/4 with κ ≤ 1.6e5 the statistics' largest condition number
here (with ε = 1e-14 the eigh run agrees to 2e-11). Both train: the loss falls from 1.19
to 0.75.
"""

from __future__ import annotations

import pytest
import torch

from mloc.runtime.optim import shampoo

po = pytest.importorskip("pytorch_optimizer")
F64 = torch.float64


def problem():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=gen, dtype=F64)
    y = torch.randn(32, 6, generator=gen, dtype=F64)
    w1 = torch.randn(6, 6, generator=gen, dtype=F64) / 6**0.5
    w2 = torch.randn(6, 6, generator=gen, dtype=F64) / 6**0.5

    def loss(a, b):
        return ((torch.tanh(x @ a.T) @ b.T - y) ** 2).mean()
    return loss, (w1, w2)


@pytest.mark.parametrize("method,wd,decoupled", [("newton", 0.01, False), ("eigh", 0.01, True)])
def test_first_100_steps_agree(method, wd, decoupled):
    loss, init = problem()
    ours = tuple(p.clone() for p in init)
    theirs = [p.clone().requires_grad_(True) for p in init]
    ref = po.Shampoo(theirs, lr=0.05, momentum=0.0, weight_decay=wd, weight_decouple=decoupled,
                     preconditioning_compute_steps=1, matrix_eps=0.0)
    opt = shampoo(lr=0.05, beta2=1.0, momentum=0.0, epsilon=1e-12, weight_decay=wd,
                  decoupled_weight_decay=decoupled, update_every=1, start_preconditioning_step=0,
                  block_size=64, graft="none", root_method=method)
    state = opt.init(ours)
    worst = 0.0
    for _ in range(100):
        ref.zero_grad()
        loss(*theirs).backward()
        ref.step()
        a, b = (p.detach().requires_grad_(True) for p in ours)
        grads = torch.autograd.grad(loss(a, b), (a, b))
        with torch.no_grad():
            state = opt.commit(grads, state, ours)
        for p, q in zip(ours, theirs):
            worst = max(worst, ((p - q.detach()).norm() / q.detach().norm()).item())
    assert worst <= 1e-8, worst
    assert loss(*ours).item() < 0.7 * loss(*init).item()      # it trained
