"""itd's three modes compute one number: forward mode (batched tangents) and recompute mode
(√T checkpoints) against reverse mode, in float64, to 1e-12 relative; reverse mode against
a hand-written float64 unroll; recompute's sweep bitwise that of keeping every iterate, at
the stated number of recomputed steps; forward mode one direction at a time where the
batch cannot be taken.

The programs are HPO programs (per-feature weight decays of a logistic regression, the
shape of programs/hpo.mlo), away from the lower's solution. Autograd agrees with itself
to ~1e-16 here; the bound leaves room for the K-step products. (A fresh Adam's first step
is ≈ −η·sign(g): its derivative is ~ε/|g| and the hypergradient through it is all
cancellation, so the Adam cases start from a warmed-up state or take several steps.)
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mloc
from mloc.runtime import Edge, Problem, adam, itd, sgd
from mloc.runtime.optim import commit_present
from mloc.runtime.grad.problem import LowerOp
from mloc.runtime.methods import unrolled
from mloc.shared.warning import MlocWarning
from tests.runtime.hand_built import hierarchy
from tests.runtime.oracles import F64, gen, leaf, randn, rel

TOL = 1e-12
HPO = Path(__file__).resolve().parents[2] / "programs" / "hpo.mlo"
MODES = ("reverse", "forward", "recompute")


# --- hpo.mlo itself, through the whole pipeline ----------------------------------------------

def hpo_hypergrad(mode, steps, truncate=None, optimizer=None):
    """The hypergradient of hpo.mlo's `decay` at its first batch, with `itd` in `mode`."""
    cut = f", truncate={truncate}" if truncate else ""
    sets = [f"decay->model.hypergrad=itd(steps={steps}{cut}, mode={mode})", f"decay->model.unroll={steps}"]
    if optimizer:
        sets.append(f"model.optimizer={optimizer}")
    p = mloc.load(HPO, dtype="float64", set=tuple(sets)).program
    p.draw("model")
    p.draw("decay")
    return torch.cat([g.reshape(-1) for g in p.hierarchy.hypergrad("decay", accumulate=False)])


@pytest.mark.parametrize("optimizer", [None, "sgd(lr=0.3, momentum=0.5, nesterov=true)", "adam(lr=0.05)"])
@pytest.mark.parametrize("steps,truncate", [(12, None), (12, 5)])
def test_hpo_program_modes_agree(optimizer, steps, truncate):
    """hpo.mlo (SGD with momentum 0.9 as written; Nesterov; Adam) in float64."""
    got = {m: hpo_hypergrad(m, steps, truncate, optimizer) for m in MODES}
    assert float(got["reverse"].norm()) > 1e-6         # a real number, not a vacuous zero
    assert rel(got["forward"], got["reverse"]) < TOL
    assert torch.equal(got["recompute"], got["reverse"])   # the same steps and sweep, bitwise


# --- hand-built: unused parameters, a hand-written unroll -------------------------------------

class Hpo:
    """Logistic regression ``w, b`` with penalty ``½Σ e^{λ_j} w_j²/n`` on a train split, BCE on
    a validation split. The lower also holds ``idle``: its loss never reaches it, so every
    step leaves it where it was (no weight decay, no momentum), and the validation loss
    reads it (a step that moved it would change the hypergradient). The upper also holds
    ``spare``, which the lower's loss never reads."""

    def __init__(self, seed, n=40, d=6):
        g = gen(seed)
        self.X, self.Xv = randn(g, n, d), randn(g, n, d)
        w_true = randn(g, d)
        self.y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(self.X @ w_true)).to(F64)
        self.yv = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(self.Xv @ w_true)).to(F64)
        self.w0, self.b0, self.lam0 = 0.3 * randn(g, d), randn(g, 1), randn(g, d) - 1.0

    def inner(self, w, b, lam):
        n = len(self.y)
        return F.binary_cross_entropy_with_logits(self.X @ w + b, self.y) + 0.5 * (lam.exp() * w * w).sum() / n

    def outer(self, w, b, idle):
        return F.binary_cross_entropy_with_logits(self.Xv @ w + b + 0.1 * idle.sum(), self.yv)

    def program(self, method, optimizer, warm=0):
        theta = (leaf(self.w0), leaf(self.b0), leaf(torch.ones(2, dtype=F64)))
        uppers = (leaf(self.lam0), leaf(torch.zeros(3, dtype=F64)))
        lower = Problem("w", theta, lambda th, up: self.inner(th[0], th[1], up[0]), ("w", "lam"), optimizer)
        upper = Problem("lam", uppers, lambda th: self.outer(*th), ("w",))
        for _ in range(warm):      # committed steps: the unroll starts from a live optimizer state
            g = torch.autograd.grad(self.inner(*theta[:2], uppers[0]), theta[:2])
            with torch.no_grad():
                lower.state = commit_present(optimizer, g + (torch.zeros(2, dtype=F64),), lower.state,
                                             theta, (2,))
        return hierarchy([lower, upper], [Edge("lam", "w", method)]), uppers

    def hypergrad(self, method, optimizer, warm=0):
        hier, uppers = self.program(method, optimizer, warm)
        hier.hypergrad("lam")
        return uppers[0].grad, uppers[1].grad

    def unrolled_sgd(self, steps, lr, mu, truncate=None):
        """``dF(θ_K)/dλ`` through SGD with heavy-ball momentum, written out by hand."""
        lam = leaf(self.lam0)
        w, b = self.w0.clone(), self.b0.clone()
        buf = None
        for k in range(steps):
            graph = truncate is None or k >= steps - truncate
            if not graph:
                w, b = w.detach(), b.detach()
                buf = None if buf is None else tuple(t.detach() for t in buf)
            w, b = w.requires_grad_() if not w.requires_grad else w, b.requires_grad_() if not b.requires_grad else b
            l = lam if graph else lam.detach()
            gw, gb = torch.autograd.grad(self.inner(w, b, l), (w, b), create_graph=graph)
            buf = (gw, gb) if buf is None else (mu * buf[0] + gw, mu * buf[1] + gb)
            w, b = w - lr * buf[0], b - lr * buf[1]
        return torch.autograd.grad(self.outer(w, b, torch.ones(2, dtype=F64)), lam)[0]


OPTIMIZERS = {"momentum": (sgd(0.5, momentum=0.9), 0), "nesterov": (sgd(0.4, momentum=0.5, nesterov=True), 0),
              "weight decay": (sgd(0.5, weight_decay=0.01), 0), "adam": (adam(0.05), 0),
              "adam, warm": (adam(0.05), 3)}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("steps,truncate", [(9, None), (9, 4), (1, None)])
def test_modes_agree_with_unused_parameters(seed, name, steps, truncate):
    """Forward and recompute equal reverse on every upper tensor; a lower parameter the
    loss never reaches stays put in every mode; an upper tensor the loss never reads gets
    nothing (None in reverse mode, where autograd finds no path; zeros in the others, where
    its tangent columns stay 0)."""
    if name == "adam" and steps == 1:
        pytest.skip("a fresh Adam step's derivative is all cancellation (module docstring)")
    opt, warm = OPTIMIZERS[name]
    h = Hpo(seed)
    want, spare = h.hypergrad(itd(steps, truncate, "reverse"), opt, warm)
    assert spare is None and float(want.norm()) > 1e-8
    for mode in ("forward", "recompute"):
        got, got_spare = h.hypergrad(itd(steps, truncate, mode), opt, warm)
        assert rel(got, want) < TOL, mode
        assert got_spare is None or not got_spare.any(), mode


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("steps,truncate", [(7, None), (7, 3)])
def test_reverse_equals_a_hand_written_unroll(seed, steps, truncate):
    h = Hpo(seed)
    want = h.unrolled_sgd(steps, 0.5, 0.9, truncate)
    got, _ = h.hypergrad(itd(steps, truncate, "reverse"), sgd(0.5, momentum=0.9))
    assert rel(got, want) < TOL


# --- recompute: the checkpoints ----------------------------------------------------------------

@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 9, 10, 16, 17, 50, 99, 100])
def test_checkpoints_cover_the_unroll_in_sqrt_segments(steps):
    c = unrolled.segment_length(steps)
    assert c == math.ceil(math.sqrt(steps))
    marks = list(range(0, steps, c))
    cps = unrolled._Checkpoints(tuple(marks), c, steps)
    segments = [(start, n) for start, n in cps.segments()]
    assert [s for s, _ in segments] == marks[::-1]
    assert sum(n for _, n in segments) == steps and max(n for _, n in segments) <= c
    # live iterates at most: every checkpoint plus one segment
    assert len(marks) + c <= 2 * math.ceil(math.sqrt(steps)) + 1


def counted(h, opt, method):
    """The number of lower-loss evaluations of one hypergradient, and its value."""
    hier, uppers = h.program(method, opt)
    lower = hier.problems["w"]
    calls, loss = [0], lower.loss

    def loss_counted(*args):
        calls[0] += 1
        return loss(*args)
    lower.loss = loss_counted
    hier.hypergrad("lam")
    return calls[0], uppers[0].grad


@pytest.mark.parametrize("steps,truncate", [(16, None), (23, None), (23, 10)])
def test_recompute_costs_one_extra_graph_free_unroll(steps, truncate):
    """Loss evaluations: the unroll (K), the segments' recomputation (T − ⌈T/c⌉, c = ⌈√T⌉),
    the T rebuilt steps and the upper's loss; reverse mode: K and the upper's loss."""
    h, opt = Hpo(0), sgd(0.5, momentum=0.9)
    t = truncate or steps
    n_rev, want = counted(h, opt, itd(steps, truncate, "reverse"))
    n_rec, got = counted(h, opt, itd(steps, truncate, "recompute"))
    assert n_rev == steps
    assert n_rec == steps + (t - math.ceil(t / unrolled.segment_length(t))) + t
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["momentum", "adam, warm"])
def test_recompute_is_bitwise_keeping_every_iterate(name):
    """The checkpointed sweep against the sweep over every stored iterate (what recompute
    mode did before checkpoints), built here from the same step: bitwise equal."""
    opt, warm = OPTIMIZERS[name]
    h, steps = Hpo(1), 11
    got, _ = h.hypergrad(itd(steps, mode="recompute"), opt, warm)
    hier, uppers = h.program(itd(steps, mode="recompute"), opt, warm)
    lower = hier.problems["w"]
    op = LowerOp(lower, [lower.params, uppers])
    theta, state, every = lower.params, lower.state, []
    for _ in range(steps):
        every.append((theta, state))
        theta, state = unrolled._detached(*unrolled._step(op, theta, state, False))
    v = torch.autograd.grad(h.outer(*theta), theta)
    adjoint = unrolled._Adjoint(v)
    for theta_k, state_k in reversed(every):
        adjoint.back(op, theta_k, state_k, uppers)
    assert torch.equal(adjoint.acc[0], got)


# --- forward: batches of directions, and the fallback ------------------------------------------

def test_forward_in_several_batches(monkeypatch):
    """More directions than one batch: the chunks' tangents are concatenated in order."""
    h, opt = Hpo(0, d=6), sgd(0.5, momentum=0.9)
    want, _ = h.hypergrad(itd(6, mode="reverse"), opt)
    monkeypatch.setattr(unrolled, "DIRECTIONS_PER_BATCH", 4)      # m = 6 + 3 = 9: 3 batches
    got, _ = h.hypergrad(itd(6, mode="forward"), opt)
    assert rel(got, want) < TOL


class _Square(torch.autograd.Function):
    """``x²``, differentiable to any order by hand-written Functions; the third-order code
    (:class:`_Third`) branches on the values it is given, as a user's clipping op might."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return _Twice.apply(g, x)


class _Twice(torch.autograd.Function):
    """``2·g·x``."""

    @staticmethod
    def forward(ctx, g, x):
        ctx.save_for_backward(g, x)
        return 2 * g * x

    @staticmethod
    def backward(ctx, h):
        g, x = ctx.saved_tensors
        return _Third.apply(h, x), _Third.apply(h, g)


class _Third(torch.autograd.Function):
    """``2·h·y``; its backward reads ``h`` on the host (not possible under vmap)."""

    @staticmethod
    def forward(ctx, h, y):
        ctx.save_for_backward(h, y)
        return 2 * h * y

    @staticmethod
    def backward(ctx, k):
        h, y = ctx.saved_tensors
        if bool((k != 0).any()):
            return 2 * k * y, 2 * k * h
        return torch.zeros_like(h), torch.zeros_like(y)


def test_forward_falls_back_to_one_direction_at_a_time():
    """A loss whose third-order code the batched backward cannot run: forward mode warns,
    pushes the directions one at a time, and still equals reverse mode."""
    g = gen(3)
    A, c, lam0, w0 = randn(g, 5, 5), randn(g, 5), randn(g, 4), randn(g, 5)

    def inner(th, up):
        w = th[0]
        return 0.5 * _Square.apply(A @ w - c).sum() / 5 + (up[0].exp() * w[:4] * w[:4]).sum()

    def build(mode):
        w, lam = leaf(w0), leaf(lam0)
        lower = Problem("w", (w,), inner, ("w", "lam"), sgd(0.1, momentum=0.5))
        upper = Problem("lam", (lam,), lambda th: (th[0] * th[0]).sum(), ("w",))
        hierarchy([lower, upper], [Edge("lam", "w", itd(5, mode=mode))]).hypergrad("lam")
        return lam.grad
    want = build("reverse")
    with pytest.warns(MlocWarning, match="one at a time"):
        got = build("forward")
    assert rel(got, want) < TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # recompute needs no batch: no warning
        assert rel(build("recompute"), want) < TOL


# --- memory ---------------------------------------------------------------------------------

def test_forward_mode_keeps_only_the_tangents():
    """What forward mode keeps between steps: ``θ_T`` and one ``(m, *shape)`` tangent per
    parameter, whatever the number of steps."""
    h, opt = Hpo(0), sgd(0.5, momentum=0.9)
    for steps in (2, 20):
        hier, uppers = h.program(itd(steps, mode="forward"), opt)
        lower = hier.problems["w"]
        op = LowerOp(lower, [lower.params, uppers])
        theta, z = unrolled._forward(op, lower.params, lower.state, steps)
        m = sum(t.numel() for t in uppers)
        assert [t.shape for t in z] == [(m,) + p.shape for p in lower.params]


@pytest.mark.parametrize("opt", [sgd, adam])
def test_modes_agree_on_a_learnable_learning_rate(opt):
    """The upper trains the lower's step size (a tensor its optimizer holds; no loss reads
    it): forward and recompute differentiate through the update as reverse mode does."""
    g = gen(5)
    A = randn(g, 4, 4)
    A = A @ A.T / 4 + torch.eye(4, dtype=F64)
    c, w0 = randn(g, 4), randn(g, 4)

    def hypergrad(mode):
        lr = torch.tensor(0.05, dtype=F64, requires_grad=True)
        lower = Problem("w", (leaf(w0),), lambda th: 0.5 * th[0] @ A @ th[0] - c @ th[0], ("w",), opt(lr))
        upper = Problem("lr", (lr,), lambda th: (th[0] * th[0]).sum(), ("w",))
        hierarchy([lower, upper], [Edge("lr", "w", itd(6, mode=mode))]).hypergrad("lr")
        return lr.grad
    want = hypergrad("reverse")
    assert want is not None and abs(float(want)) > 1e-6
    for mode in ("forward", "recompute"):
        assert rel(hypergrad(mode), want) < TOL, mode
