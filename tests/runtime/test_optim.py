"""Functional optimizers: parity with torch.optim, SAMA's diagonal against autograd,
differentiability through hyperparameters, the in-place commit, and the interface an
optimizer with a matrix state fits. (The names the checker validates are compared with the
runtime factories in tests/test_builtins_registry.py, from the descriptor registry.)"""


import pytest
import torch

from mloc.runtime.base import tree
from mloc.runtime.optim import Optimizer, adam, adamw, apply_updates, sgd

OPTIMIZERS = {"sgd": sgd, "adam": adam, "adamw": adamw}

F64 = torch.float64
CONFIGS = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("adam", dict(lr=0.01)),
    ("adam", dict(lr=0.01, weight_decay=0.1, betas=(0.8, 0.99))),
    ("adamw", dict(lr=0.01)),
    ("adamw", dict(lr=0.01, weight_decay=0.1, eps=1e-6)),
]
TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def grads_sequence(seed, shapes, steps):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, generator=g, dtype=F64) for s in shapes) for _ in range(steps)]


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_matches_torch_optim(name, kw):
    """Same trajectory as torch.optim's single-tensor path, to rounding (1e-13 relative)."""
    shapes = [(3, 4), (4,)]
    ours = tuple(torch.randn(s, generator=torch.Generator().manual_seed(9), dtype=F64) for s in shapes)
    theirs = [p.clone().requires_grad_() for p in ours]
    opt, ref = OPTIMIZERS[name](**kw), TORCH[name](theirs, foreach=False, **kw)
    state = opt.init(ours)
    for grads in grads_sequence(0, shapes, 6):
        updates, state = opt.update(grads, state, ours)
        ours = apply_updates(ours, updates)
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        ref.step()
    for a, b in zip(ours, theirs):
        assert torch.linalg.vector_norm(a - b.detach()) <= 1e-13 * torch.linalg.vector_norm(b)


@pytest.mark.parametrize("name,kw", CONFIGS + [("adam", dict(lr=0.01, eps=0.0)),
                                              ("adamw", dict(lr=0.02, eps=0.0, weight_decay=0.3))])
@pytest.mark.parametrize("warm", [0, 3])
def test_diag_is_the_derivative_of_the_update(name, kw, warm):
    """``diag`` = −∂update/∂g elementwise (autograd's Jacobian diagonal) to 1e-12, before
    the first step and after ``warm`` steps (SAMA's ``s``; Adam with ε = 0 is the case the
    reference formula states). The bound is relative to ‖s‖ + ‖lr/|g|‖: on Adam's first
    step (a sign step, ∂/∂g = lr·ε/(|g|+ε)², exactly 0 for ε = 0) two terms of size lr/|g|
    cancel, and that is the scale of the round-off."""
    shapes = [(5,), (2, 3)]
    opt = OPTIMIZERS[name](**kw)
    params = tuple(torch.randn(s, generator=torch.Generator().manual_seed(1), dtype=F64) for s in shapes)
    state = opt.init(params)
    for grads in grads_sequence(2, shapes, warm):
        state = opt.update(grads, state, params)[1]
    grads = grads_sequence(3, shapes, 1)[0]
    s = opt.diag(grads if opt.diag_uses_grad else None, state, params)
    for i, g in enumerate(grads):
        def f(gi):
            gs = grads[:i] + (gi,) + grads[i + 1:]
            return opt.update(gs, state, params)[0][i].reshape(-1)
        jac = torch.autograd.functional.jacobian(f, g).reshape(g.numel(), g.numel())
        want = -jac.diagonal().reshape(g.shape)
        assert torch.count_nonzero(jac - torch.diag(jac.diagonal())) == 0  # elementwise
        got = torch.as_tensor(s[i], dtype=F64).expand_as(want)
        scale = torch.linalg.vector_norm(want) + torch.linalg.vector_norm(kw["lr"] / g.abs())
        assert torch.linalg.vector_norm(got - want) <= 1e-12 * scale


@pytest.mark.parametrize("make", [lambda lr: sgd(lr, momentum=0.9), lambda lr: adam(lr),
                                  lambda lr: adamw(lr, weight_decay=0.1)])
def test_differentiable_in_a_tensor_learning_rate(make):
    a = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=F64)

    def final_loss(lr):
        opt = make(lr)
        theta = (torch.tensor([1.0, -2.0], dtype=F64),)
        state = opt.init(theta)
        for _ in range(4):
            g = (a @ theta[0],)
            updates, state = opt.update(g, state, theta)
            theta = apply_updates(theta, updates)
        return 0.5 * theta[0] @ a @ theta[0]
    lr = torch.tensor(0.05, dtype=F64, requires_grad=True)
    (got,) = torch.autograd.grad(final_loss(lr), lr)
    h = 1e-6
    want = (final_loss(torch.tensor(0.05 + h, dtype=F64)) - final_loss(torch.tensor(0.05 - h, dtype=F64))) / (2 * h)
    assert abs(float(got - want)) <= 1e-7 * abs(float(want))


def commit(opt, params, state, grads):
    with torch.no_grad():
        return opt.commit(grads, state, params)


def test_step_commits_the_functional_update_in_place():
    """A tensor learning rate (what a schedule sets) has no in-place formula: `commit`
    applies the functional update."""
    p = torch.nn.Parameter(torch.ones(3, dtype=F64))
    p.grad = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    opt = adam(torch.tensor(0.1, dtype=F64))
    assert not opt.inplace
    state = commit(opt, (p,), opt.init((p,)), (p.grad,))
    want = apply_updates((torch.ones(3, dtype=F64),), opt.update((p.grad,), opt.init((p,)), (p,))[0])
    assert torch.equal(p.detach(), want[0]) and state.count == 1


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name,kw", CONFIGS)
def test_step_is_torch_optim_bit_for_bit(name, kw, dtype, foreach):
    """The in-place commit equals torch.optim's step exactly, single-tensor and
    multi-tensor (on the CPU the two agree), in parameters and in the state's buffers,
    over several steps."""
    shapes = [(3, 4), (4,), ()]
    g = torch.Generator().manual_seed(9)
    ours = tuple(torch.randn(s, generator=g, dtype=dtype) for s in shapes)
    theirs = [p.clone().requires_grad_() for p in ours]
    opt, ref = OPTIMIZERS[name](**kw), TORCH[name](theirs, foreach=foreach, **kw)
    assert opt.inplace
    state = opt.init(ours)
    for grads in grads_sequence(0, shapes, 7):
        grads = tuple(t.to(dtype) for t in grads)
        kept = tuple(t.clone() for t in grads)
        state = commit(opt, ours, state, grads)
        assert all(torch.equal(a, b) for a, b in zip(grads, kept))     # gradients are read only
        for p, t in zip(theirs, grads):
            p.grad = t.clone()
        ref.step()
        assert all(torch.equal(a, b.detach()) for a, b in zip(ours, theirs))
    assert state.count == 7
    if name == "sgd" and kw.get("momentum"):
        bufs = [ref.state[p]["momentum_buffer"] for p in theirs]
        assert all(torch.equal(a, b) for a, b in zip(state.momentum, bufs))
    if name != "sgd":
        assert all(torch.equal(a, ref.state[p]["exp_avg"]) for a, p in zip(state.mu, theirs))
        assert all(torch.equal(a, ref.state[p]["exp_avg_sq"]) for a, p in zip(state.nu, theirs))


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_update_and_diag_read_the_state_the_in_place_step_leaves(name, kw):
    """After in-place commits, the functional `update` and `diag` (what unrolled methods and
    SAMA read) give what they give from the functional trajectory's state, to rounding;
    and the grads the commit read are left as they were."""
    shapes = [(3, 4), (4,)]
    start = tuple(torch.randn(s, generator=torch.Generator().manual_seed(2), dtype=F64) for s in shapes)
    opt = OPTIMIZERS[name](**kw)
    seq = grads_sequence(1, shapes, 5)
    inplace, st_in = tuple(p.clone() for p in start), opt.init(start)
    functional, st_fn = start, opt.init(start)
    for grads in seq[:4]:
        kept = tuple(t.clone() for t in grads)
        st_in = commit(opt, inplace, st_in, grads)
        assert all(torch.equal(a, b) for a, b in zip(grads, kept))
        updates, st_fn = opt.update(grads, st_fn, functional)
        functional = apply_updates(functional, updates)
    close = lambda a, b: all(  # noqa: E731
        torch.linalg.vector_norm(torch.as_tensor(x) - torch.as_tensor(y))
        <= 1e-12 * torch.linalg.vector_norm(torch.as_tensor(y)) for x, y in zip(a, b))
    assert st_in.count == st_fn.count == 4
    assert close(inplace, functional)
    assert close(tree.tensors(st_in), tree.tensors(st_fn))
    assert close(opt.update(seq[4], st_in, inplace)[0], opt.update(seq[4], st_fn, functional)[0])
    assert close(opt.diag(seq[4], st_in, inplace), opt.diag(seq[4], st_fn, functional))


def test_tensor_hyperparameters_take_the_functional_commit():
    lr = torch.tensor(0.1, dtype=F64)
    for opt in (sgd(lr, momentum=0.9), sgd(0.1, momentum=torch.tensor(0.9, dtype=F64)),
                adam(lr), adamw(0.01, weight_decay=torch.tensor(0.1, dtype=F64))):
        assert not opt.inplace
        p = (torch.ones(3, dtype=F64),)
        state = opt.init(p)
        for k in range(3):
            want = apply_updates(p, opt.update((torch.full((3,), k + 1.0, dtype=F64),), state, p)[0])
            state = commit(opt, p, state, (torch.full((3,), k + 1.0, dtype=F64),))
            assert torch.equal(p[0], want[0])


def test_nesterov_needs_momentum():
    with pytest.raises(ValueError):
        sgd(0.1, nesterov=True)


@pytest.mark.parametrize("make", [lambda: adam(0.01, eps=0.0), lambda: adamw(0.01, eps=0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sama_adam_diag_against_the_reference_formula(make, seed):
    """After some steps, ε = 0: s equals autograd's derivative of the Adam step and SAMA's
    formula η√c₂/c₁·[(1−β₁)β₂v_{t−1} − β₁(1−β₂)g·m_{t−1}]/v_t^{3/2}, both to 1e-12 relative."""
    opt, (b1, b2) = make(), (0.9, 0.999)
    gen = torch.Generator().manual_seed(seed)
    params = (torch.randn(7, generator=gen, dtype=F64),)
    state = opt.init(params)
    for _ in range(4):
        state = opt.update((torch.randn(7, generator=gen, dtype=F64),), state, params)[1]
    g = torch.randn(7, generator=gen, dtype=F64)
    s = opt.diag((g,), state, params)[0]
    auto = -torch.func.jacrev(lambda x: opt.update((x,), state, params)[0][0])(g).diagonal()
    t = state.count + 1
    m, v = state.mu[0], state.nu[0]
    v_t = b2 * v + (1 - b2) * g * g
    formula = (0.01 * (1 - b2**t) ** 0.5 / (1 - b1**t)
               * ((1 - b1) * b2 * v - b1 * (1 - b2) * g * m) / v_t**1.5)
    for want in (auto, formula):
        assert torch.linalg.vector_norm(s - want) <= 1e-12 * torch.linalg.vector_norm(want)


def test_a_matrix_statistics_optimizer_fits_the_interface():
    """What Shampoo will need: a state of matrix statistics, an update run without graph,
    no diagonal. It trains through `Problem.step`, serves under finite_diff, and sama
    refuses it with a message instead of guessing a diagonal."""
    from mloc.runtime import Edge, Problem, finite_diff, sama
    from tests.runtime.hand_built import hierarchy

    class Toy(Optimizer):       # state: a dict of per-parameter lists of matrices
        def init(self, params):
            return {"count": 0, "left": [[torch.eye(p.shape[0], dtype=p.dtype)] for p in params]}

        @torch.no_grad()
        def update(self, grads, state, params):
            left = [[s + g @ g.T] for (s,), g in zip(state["left"], grads)]
            roots = [torch.linalg.matrix_power(torch.linalg.cholesky(s), -1) for (s,) in left]
            return (tuple(-0.1 * r @ g for r, g in zip(roots, grads)),
                    {"count": state["count"] + 1, "left": left})

    toy = Toy()
    w, lam = torch.ones(3, 2, dtype=F64, requires_grad=True), torch.ones(3, 2, dtype=F64, requires_grad=True)
    lower = Problem("w", (w,), lambda w, l: ((w[0] - l[0]) ** 2).sum(), ("w", "lam"), toy)
    upper = Problem("lam", (lam,), lambda w: (w[0] ** 2).sum(), ("w",))
    before = w.detach().clone()
    w.grad = torch.ones_like(w)
    lower.step()
    assert lower.state["count"] == 1 and not torch.equal(w.detach(), before)
    snapshot = tree.clone(lower.state)
    restored = tree.from_plain(tree.to_plain(snapshot), toy.init((w,)))
    assert torch.equal(restored["left"][0][0], lower.state["left"][0][0])
    hierarchy([lower, upper], [Edge("lam", "w", finite_diff())]).hypergrad("lam")
    assert lam.grad is not None
    with pytest.raises(ValueError, match="diagonal"):
        hierarchy([lower, upper], [Edge("lam", "w", sama())]).hypergrad("lam")


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_in_place_step_of_a_problem_without_parameters(name, kw):
    """A problem whose trainable glob selects nothing still counts its steps."""
    opt = OPTIMIZERS[name](**kw)
    state = opt.init(())
    for _ in range(2):
        state = commit(opt, (), state, ())
    assert state.count == 2
