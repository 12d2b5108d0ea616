"""The functional Shampoo optimizer (mloc.runtime.optim.shampoo) against independent
float64 references: closed-form directions, blocking with padding, grafting, momentum and
weight decay equal to mloc's SGD/Adam before the preconditioning start, stale and
asynchronous roots, rejected roots, the SAMA diagonal, differentiation, checkpoints."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from mloc.runtime.base import tree
from mloc.runtime.optim import adam as make_adam, sgd as make_sgd, shampoo
from mloc.runtime.optim.blocks import from_blocks, kron_diagonal, layout, precondition, to_blocks
from mloc.shared.warning import MlocWarning
from tests.shampoo.helpers import F64, blockwise_direction, eig_root


def grads_seq(shapes, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, generator=gen, dtype=F64) for s in shapes) for _ in range(steps)]


def run(opt, params, seq):
    """Commit ``seq`` of gradients; returns the final state (params updated in place)."""
    state = opt.init(params)
    with torch.no_grad():
        for g in seq:
            state = opt.commit(g, state, params)
    return state


# --- layout --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,merged,block,grid,policy", [
    ((64, 3, 3, 3), (64, 27), (64, 27), (1, 1), "shampoo"),     # conv kernel: small dims merged
    ((20, 3), (20, 3), (20, 3), (1, 1), "shampoo"),             # never merged into a vector
    ((4, 4, 4), (4, 16), (4, 16), (1, 1), "shampoo"),
    ((200, 300), (200, 300), (128, 128), (2, 3), "shampoo"),    # padded to 256 x 384
    ((10,), (), (), (), "diagonal"),                            # 1-D: grafted diagonal update
    ((1, 7), (), (), (), "diagonal"),
    ((10000, 4), (), (), (), "diagonal"),                       # a dim above max_precond_dim
])
def test_layout_policy(shape, merged, block, grid, policy):
    lay = layout(shape, 128, 8192)
    assert (lay.merged, lay.block, lay.grid, lay.policy) == (merged, block, grid, policy)
    if policy == "shampoo":
        x = torch.randn(shape, dtype=F64)
        assert torch.equal(from_blocks(to_blocks(x, lay), lay), x)


def test_blocked_preconditioning_matches_explicit_block_loops():
    """A 7×5 matrix in 3×3 blocks (padded to 9×6): the direction equals an explicit loop
    over the (unpadded, unequal) blocks with eigendecomposition roots of each block's own
    statistics, ridge ε·λmax of each block: padding is exact."""
    gs = [g[0] for g in grads_seq([(7, 5)], 3)]
    lay = layout((7, 5), 3, 8192)
    assert lay.grid == (3, 2) and lay.block == (3, 3)
    stats = None
    for g in gs:
        new = [torch.stack([b @ b.T for b in to_blocks(g, lay)]),
               torch.stack([b.T @ b for b in to_blocks(g, lay)])]
        stats = new if stats is None else [s + n for s, n in zip(stats, new)]
    from mloc.runtime.optim.roots import inverse_root
    roots = [inverse_root(s, 4, epsilon=1e-3, method="eigh").root for s in stats]
    got = from_blocks(precondition(to_blocks(gs[-1], lay), roots), lay)
    assert torch.allclose(got, blockwise_direction(gs, 3, 1e-3), rtol=1e-5, atol=1e-9)
    # the power-iteration lambda_max is exact to ~1e-6 relative: the bound above


def test_three_mode_tensor_exponent_minus_one_sixth():
    """A 3-mode tensor: each mode preconditioned with exponent −1/6; equals the mode
    products G ×₁ Q₁ ×₂ Q₂ ×₃ Q₃ computed with einsum."""
    g = torch.randn(3, 4, 5, dtype=F64)
    lay = layout(g.shape, 8, 8192)
    assert lay.merged == (3, 4, 5) and lay.p == 6
    qs = [eig_root(u @ u.T, 6, 1e-3) for u in
          (g.reshape(3, -1), g.permute(1, 0, 2).reshape(4, -1), g.permute(2, 0, 1).reshape(5, -1))]
    want = torch.einsum("ia,jb,kc,abc->ijk", *qs, g)
    got = from_blocks(precondition(to_blocks(g, lay), [q[None] for q in qs]), lay)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
    d = from_blocks(kron_diagonal([q[None] for q in qs]), lay)
    assert torch.allclose(d, torch.einsum("i,j,k->ijk", *(q.diagonal() for q in qs)), rtol=1e-14)


# --- the update against closed forms ----------------------------------------------------------

@pytest.mark.parametrize("beta2", [1.0, 0.9])
def test_ungrafted_updates_are_the_closed_form(beta2):
    """graft none, no momentum, preconditioning from step 1, roots every step: the update
    at step t is −η·(L̂ₜ)^{-1/4} Gₜ (R̂ₜ)^{-1/4}, statistics a running sum (β₂ = 1) or an
    EMA with weight 1−β₂; float64, relative error ≤ 1e-8 (Newton tolerance 1e-10,
    power-iteration λmax to 1e-6 relative in a ridge of 1e-6)."""
    lr, eps = 0.1, 1e-6
    seq = grads_seq([(6, 4)], 5)
    opt = shampoo(lr=lr, beta2=beta2, momentum=0.0, epsilon=eps, graft="none",
                  start_preconditioning_step=0)
    w = torch.zeros(6, 4, dtype=F64)
    state = opt.init((w,))
    L, R = torch.zeros(6, 6, dtype=F64), torch.zeros(4, 4, dtype=F64)
    wgt = 1.0 if beta2 == 1 else 1 - beta2
    for (g,) in seq:
        L, R = beta2 * L + wgt * g @ g.T, beta2 * R + wgt * g.T @ g
        upd, state = opt.update((g,), state, (w,))
        want = -lr * eig_root(L, 4, eps) @ g @ eig_root(R, 4, eps)
        assert torch.linalg.norm(upd[0] - want) <= 1e-8 * torch.linalg.norm(want)


def test_before_the_start_it_is_the_grafted_optimizer():
    """Until start_preconditioning_step: graft sgd with Nesterov momentum and coupled weight
    decay is mloc's SGD step for step (bit for bit: the same formulas); graft adam without
    momentum is mloc's Adam with ε = 1e-10 (to 1e-14)."""
    seq = grads_seq([(5, 3), (3,)], 6, seed=1)
    init = grads_seq([(5, 3), (3,)], 1, seed=2)[0]
    a = tuple(p.clone() for p in init)
    b = tuple(p.clone() for p in init)
    run(shampoo(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                decoupled_weight_decay=False, graft="sgd", start_preconditioning_step=100), a, seq)
    state = make_sgd(0.1, 0.9, True, 0.01).init(b)
    for g in seq:
        state = make_sgd(0.1, 0.9, True, 0.01).update(g, state, b)[1:] and state
    sgd, st = make_sgd(0.1, 0.9, True, 0.01), None
    b = tuple(p.clone() for p in init)
    st = sgd.init(b)
    for g in seq:
        u, st = sgd.update(g, st, b)
        b = tuple(p + x for p, x in zip(b, u))
    assert all(torch.allclose(x, y, rtol=0, atol=1e-15) for x, y in zip(a, b))
    c = tuple(p.clone() for p in init)
    run(shampoo(lr=0.01, momentum=0.0, graft="adam", graft_beta2=0.999,
                start_preconditioning_step=100), c, seq)
    adam, st = make_adam(0.01, (0.9, 0.999), 1e-10), None
    d = tuple(p.clone() for p in init)
    st = adam.init(d)
    for g in seq:
        u, st = adam.update(g, st, d)
        d = tuple(p + x for p, x in zip(d, u))
    assert all(torch.allclose(x, y, rtol=1e-14, atol=1e-15) for x, y in zip(c, d))


@pytest.mark.parametrize("graft", ["sgd", "adagrad", "rmsprop", "adam"])
def test_grafting_transfers_the_norm(graft):
    """After the start, without momentum: ‖Δθ‖ of a preconditioned tensor equals η‖D‖ of
    the grafted direction (the same optimizer's pre-start update on the same state)."""
    seq = grads_seq([(6, 4)], 4, seed=3)
    kw = dict(lr=0.1, momentum=0.0, graft=graft)
    pre, post = shampoo(start_preconditioning_step=100, **kw), shampoo(start_preconditioning_step=0, **kw)
    w = torch.zeros(6, 4, dtype=F64)
    s1, s2 = pre.init((w,)), post.init((w,))
    for (g,) in seq:
        (u1,), s1 = pre.update((g,), s1, (w,))
        (u2,), s2 = post.update((g,), s2, (w,))
        assert torch.allclose(u1.norm(), u2.norm(), rtol=1e-12)
        assert not torch.allclose(u1, u2)


def test_decoupled_weight_decay():
    """Decoupled: Δθ = (the step without decay) − η·wd·θ."""
    seq = grads_seq([(4, 3)], 3, seed=4)
    w0 = torch.randn(4, 3, dtype=F64)
    a, b = (w0.clone(),), (w0.clone(),)
    kw = dict(lr=0.05, momentum=0.5, start_preconditioning_step=1)
    oa, ob = shampoo(weight_decay=0.1, **kw), shampoo(**kw)
    sa, sb = oa.init(a), ob.init(b)
    for g in seq:
        (ua,), sa = oa.update(g, sa, a)
        (ub,), sb = ob.update(g, sb, a)
        assert torch.allclose(ua, ub - 0.05 * 0.1 * a[0], rtol=1e-14, atol=1e-16)
        a = (a[0] + ua,)


# --- staleness, asynchronous roots -------------------------------------------------------------

def test_stale_roots_are_the_roots_of_s_steps_before():
    """staleness 2, roots every 2 steps: the roots in use at step t+2 are those of the
    statistics of step t (the state after step t), computed independently."""
    from mloc.runtime.optim.roots import inverse_root
    seq = grads_seq([(5, 4)], 8, seed=5)
    opt = shampoo(lr=0.01, staleness=2, update_every=2, start_preconditioning_step=0)
    w = torch.zeros(5, 4, dtype=F64)
    state, stats_at = opt.init((w,)), {}
    for t, g in enumerate(seq, 1):
        _, state = opt.update(g, state, (w,))
        stats_at[t] = state.stats[0]
        if t > 2 and t % 2 == 0:
            want = [inverse_root(s, 4, epsilon=1e-6, method=opt.hyper.root_method).root for s in stats_at[t - 2]]
            assert all(torch.equal(r, x) for r, x in zip(state.roots[0], want))


def run_async(kw, worker, seq, init, kill_after=None):
    """``(params, state tensors, jobs the worker process answered)`` of a run with
    ``async_roots`` on ``worker`` ("process", "thread"; "sync" runs ``kw`` as it is), the
    process waited for before the first step (else the first refreshes are computed here);
    ``kill_after``: SIGKILL the worker process after that many steps."""
    import os
    import signal
    opt = shampoo(async_roots=worker != "sync", **kw)
    opt.work.jobs.use_process = worker == "process"
    params = tuple(p.clone() for p in init)
    opt.start()
    try:
        assert opt.work.jobs.ready(60) == (worker == "process")
        state = opt.init(params)
        with torch.no_grad():
            for i, g in enumerate(seq):
                if i == kill_after:
                    os.kill(opt.work.jobs._process._proc.pid, signal.SIGKILL)
                    opt.work.jobs._process._proc.wait()
                state = opt.commit(g, state, params)
        opt.drain()
        answered = opt.work.jobs._process.answered if opt.work.jobs._process else 0
    finally:
        opt.close()
    assert opt.work.jobs._process is None           # closed
    return params, tree.tensors(state), answered


@pytest.mark.parametrize("worker", ["process", "thread"])
@pytest.mark.parametrize("every,s", [(1, 1), (2, 2), (3, 2), (1, 3)])
def test_asynchronous_roots_reproduce_the_staleness_mode(every, s, worker):
    """async_roots in the worker process (statistics on the CPU) and on a background thread
    (an accelerator's; here forced): parameters and state equal the synchronous
    staleness-s run bit for bit (installing waits for a job that is not done), and the
    process answered every refresh."""
    seq = grads_seq([(6, 5), (5,)], 12, seed=6)
    init = grads_seq([(6, 5), (5,)], 1, seed=7)[0]
    kw = dict(lr=0.05, staleness=s, update_every=every, start_preconditioning_step=1, block_size=4)
    want_p, want_s, _ = run_async(kw, "sync", seq, init)
    got_p, got_s, answered = run_async(kw, worker, seq, init)
    assert all(torch.equal(x, y) for x, y in zip(want_p, got_p))
    assert all(torch.equal(x, y) for x, y in zip(want_s, got_s))
    assert answered == (len(seq) // every if worker == "process" else 0)


def test_a_root_worker_that_dies_is_replaced_by_the_training_process():
    """SIGKILL the worker process mid-run: one MlocWarning, the unanswered and later
    refreshes computed in the training process, the run equal to the synchronous one bit
    for bit; close() leaves no process and no shared files."""
    import glob
    seq = grads_seq([(6, 5), (5,)], 16, seed=8)
    init = grads_seq([(6, 5), (5,)], 1, seed=9)[0]
    kw = dict(lr=0.05, staleness=4, update_every=2, start_preconditioning_step=1, block_size=4)
    mine = f"/dev/shm/mloc-roots-{os.getpid()}-*"       # this process's: other tests may run beside it
    before = set(glob.glob(mine))
    want_p, want_s, _ = run_async(kw, "sync", seq, init)
    with pytest.warns(MlocWarning, match="root worker process stopped") as caught:
        got_p, got_s, answered = run_async(kw, "process", seq, init, kill_after=7)
    assert len([w for w in caught if "root worker" in str(w.message)]) == 1
    assert all(w.message.every_rank for w in caught if "root worker" in str(w.message))   # its own worker
    assert 0 < answered < len(seq) // 2
    assert all(torch.equal(x, y) for x, y in zip(want_p, got_p))
    assert all(torch.equal(x, y) for x, y in zip(want_s, got_s))
    assert set(glob.glob(mine)) == before


@pytest.mark.parametrize("kw", [
    dict(graft="adagrad", momentum=0.9, nesterov=True),
    dict(graft="adam", momentum=0.5, nesterov=False, weight_decay=0.01, decoupled_weight_decay=False),
    dict(graft="rmsprop", momentum=0.0, beta2=0.9, weight_decay=0.01),
    dict(graft="none", momentum=0.0, root_method="newton", staleness=2, update_every=2),
    dict(graft="sgd", momentum=0.9, exponent_override=2),
])
def test_in_place_commit_is_the_functional_update(kw):
    """Training's in-place ``commit`` (foreach formulas, statistics overwritten) against
    ``params + update(...)`` (the out-of-place form ``itd`` differentiates), 25 float64
    steps on a blocked and padded matrix, a 3-mode tensor and a vector: the same step up to
    rounding (1e-12 relative; the formulas group the same operations differently)."""
    shapes = [(6, 5), (3, 4, 5), (5,)]
    seq = grads_seq(shapes, 25, seed=11)
    init = grads_seq(shapes, 1, seed=12)[0]
    opt = shampoo(lr=0.05, start_preconditioning_step=3, block_size=4, **kw)
    committed = tuple(p.clone() for p in init)
    state_c = run(opt, committed, seq)
    functional, state_f = tuple(p.clone() for p in init), opt.init(init)
    for g in seq:
        upd, state_f = opt.update(g, state_f, functional)
        functional = tuple(p + u for p, u in zip(functional, upd))
    for a, b in zip(committed, functional):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12 * b.abs().max())
    for a, b in zip(tree.tensors(state_c), tree.tensors(state_f)):
        assert torch.allclose(a.double(), b.double(), rtol=1e-12, atol=1e-12 * float(b.abs().max()))


# --- rejected roots ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["gradient", "statistic"])
def test_a_non_finite_statistic_never_reaches_the_parameters_through_a_root(how):
    """A NaN poisons the running-sum statistics for good, either through one gradient (its
    own step is the finite guard's business and is skipped here, as GradScaler would; graft
    sgd and no momentum, so nothing else keeps the NaN) or written into a statistic
    directly (default grafting and momentum). Every later root is rejected, the previous
    roots stay in use, the failures are counted and reported once, the parameters stay
    finite."""
    seq = grads_seq([(5, 4)], 12, seed=8)
    kw = dict(graft="sgd", momentum=0.0) if how == "gradient" else {}
    opt = shampoo(lr=0.01, start_preconditioning_step=0, update_every=1, **kw)
    w = torch.zeros(5, 4, dtype=F64)
    state, reports = opt.init((w,)), []
    for t, g in enumerate(seq, 1):
        if t == 4:
            good_roots = [r.clone() for r in state.roots[0]]
            if how == "gradient":
                bad = g[0].clone()
                bad[1, 2] = float("nan")
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    _, state = opt.update((bad,), state, (w,))   # poisoned, step not taken
                reports += caught
                continue
            poisoned = state.stats[0][0].clone()
            poisoned[0, 1, 2] = float("nan")
            state = state._replace(stats=((poisoned, state.stats[0][1]),))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (u,), state = opt.update(g, state, (w,))
        reports += caught
        w = w + u
        assert bool(torch.isfinite(w).all())
        if t >= 4:
            fails = t - 3 if how == "gradient" else t - 3
            assert torch.equal(state.roots[0][0], good_roots[0])
            assert int(state.failures[0][0].max()) == fails
            assert bool(torch.isnan(state.stats[0][0]).any())
    assert len(reports) == 1 and "rejected" in str(reports[0].message)
    assert reports[0].category is MlocWarning and not reports[0].message.every_rank   # one process: split
    # what a run's train records hold (Shampoo.report): the NaN gradient reaches both
    # statistics (G Gᵀ and Gᵀ G), the written NaN the left one only; 9 refreshes since
    assert opt.report(state) == {"roots_rejected": 2 if how == "gradient" else 1, "root_failures": 9}
    assert opt.report(opt.init((w,))) == {"roots_rejected": 0, "root_failures": 0}


def test_report_without_a_preconditioned_tensor_is_empty():
    """A bias alone (the diagonal policy) has no roots to report on."""
    opt = shampoo(lr=0.01)
    assert opt.report(opt.init((torch.zeros(7),))) == {}


def test_an_inf_gradient_under_an_ema():
    """With β₂ < 1 an Inf gradient (its step skipped) leaves an Inf statistic, NaN after the
    next EMA step and so on; roots are rejected, parameters finite (graft sgd, no momentum:
    nothing but the statistics keeps the Inf)."""
    seq = grads_seq([(4, 4)], 6, seed=9)
    opt = shampoo(lr=0.01, beta2=0.9, start_preconditioning_step=0, graft="sgd", momentum=0.0)
    w = torch.zeros(4, 4, dtype=F64)
    state = opt.init((w,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t, g in enumerate(seq, 1):
            if t == 2:
                _, state = opt.update((torch.full((4, 4), float("inf"), dtype=F64),), state, (w,))
                continue
            (u,), state = opt.update(g, state, (w,))
            w = w + u
    assert bool(torch.isfinite(w).all()) and int(state.failures[0][0].max()) >= 4


# --- SAMA diagonal and differentiation --------------------------------------------------------

@pytest.mark.parametrize("nesterov", [False, True])
def test_diag_is_the_exact_jacobian_diagonal_without_grafting(nesterov):
    """graft none, roots held constant: diag equals the diagonal of −∂Δθ/∂g computed by
    autograd, for a blocked padded matrix, a 3-mode tensor and a 1-D tensor (≤ 1e-12)."""
    shapes = [(7, 5), (3, 4, 5), (6,)]
    seq = grads_seq(shapes, 4, seed=10)
    opt = shampoo(lr=0.1, momentum=0.9, nesterov=nesterov, graft="none", block_size=3,
                  start_preconditioning_step=1)
    params = tuple(torch.zeros(s, dtype=F64) for s in shapes)
    state = run(opt, params, seq[:3])
    g = seq[3]
    d = opt.diag(g, state, params)
    for i, s in enumerate(shapes):
        def f(x, i=i):
            gg = tuple(x if j == i else g[j] for j in range(len(g)))
            return opt.update(gg, state, params)[0][i]
        jac = torch.autograd.functional.jacobian(f, g[i])
        n = g[i].numel()
        want = -jac.reshape(n, n).diagonal().reshape(s)
        got = torch.as_tensor(d[i], dtype=F64).expand(s)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-15)


def test_diag_with_grafting_is_scaled_and_positive():
    """With grafting the diagonal is the grafting scale times the Kronecker diagonal (an
    approximation: σ's dependence on g is dropped); check the formula and positivity."""
    seq = grads_seq([(6, 4)], 4, seed=11)
    opt = shampoo(lr=0.1, momentum=0.0, graft="adagrad", start_preconditioning_step=1)
    w = (torch.zeros(6, 4, dtype=F64),)
    state = run(opt, w, seq[:3])
    (d,) = opt.diag(seq[3], state, w)
    assert bool((d > 0).all())
    acc = state.graft[0][0] + seq[3][0] ** 2
    graft_dir = seq[3][0] / (acc.sqrt() + 1e-10)
    roots = opt.update(seq[3], state, w)[1].roots[0]
    pre = roots[0][0] @ seq[3][0] @ roots[1][0]
    want = 0.1 * graft_dir.norm() / pre.norm() * torch.outer(roots[0][0].diagonal(), roots[1][0].diagonal())
    assert torch.allclose(d, want, rtol=1e-12)


def test_update_is_differentiable_in_grads_and_lr_with_roots_constant():
    """Unrolled differentiation: the update's gradient w.r.t. a tensor learning rate and the
    gradients exists and matches central finite differences (roots refreshed from detached
    statistics, i.e. constants; the perturbation is applied at a step that does not refresh
    them, update_every 2)."""
    seq = grads_seq([(5, 4)], 3, seed=12)
    lr = torch.tensor(0.1, dtype=F64, requires_grad=True)
    opt = shampoo(lr=lr, momentum=0.9, update_every=2, start_preconditioning_step=1)
    w = (torch.zeros(5, 4, dtype=F64),)
    state = opt.init(w)
    for g in seq[:2]:
        state = opt.update(g, state, w)[1]
        state = tree.map_tensors(state, lambda t: t.detach())
    g = seq[2][0].clone().requires_grad_(True)
    (u,), _ = opt.update((g,), state, w)
    probe = torch.randn(5, 4, dtype=F64)
    dlr, dg = torch.autograd.grad((u * probe).sum(), (lr, g))
    h = 1e-6
    with torch.no_grad():
        def val(lr_v, gv):
            o = shampoo(lr=lr_v, momentum=0.9, update_every=2, start_preconditioning_step=1)
            return (o.update((gv,), state, w)[0][0] * probe).sum()
        fd_lr = (val(0.1 + h, g) - val(0.1 - h, g)) / (2 * h)
        e = torch.zeros(5, 4, dtype=F64)
        e[2, 1] = 1
        fd_g = (val(0.1, g + h * e) - val(0.1, g - h * e)) / (2 * h)
    assert torch.allclose(dlr, fd_lr, rtol=1e-7) and torch.allclose(dg[2, 1], fd_g, rtol=1e-6)


# --- checkpoints -------------------------------------------------------------------------------

@pytest.mark.parametrize("graft", ["adagrad", "rmsprop", "adam"])
def test_grafting_derivative_is_finite_where_a_gradient_entry_is_zero(graft):
    """A gradient entry that has been exactly 0 (a dead unit) leaves ``v = 0``, where ``√v``'s
    derivative is infinite and ``∞·0`` made ``itd``'s hypergradient NaN (MAML on Shampoo,
    found by tests/run/test_no_internal_errors.py). The direction's Jacobian is finite: on
    the zero entry, at the first step, ``∂D/∂g = 1/δ``, the derivative of ``g/(√v + δ)`` as
    written (Adam's ``m̂`` is ``g`` at step 1); the values are unchanged (the same numbers as
    the in-place training step)."""
    from mloc.runtime.optim import graft as grafting
    g = torch.tensor([0.0, 0.5, -2.0], dtype=F64, requires_grad=True)
    acc = tuple(torch.zeros(3, dtype=F64) for _ in range(grafting.ACCUMULATORS[graft]))
    _, d = grafting.direction(graft, 0.999, 1, g, acc)
    inplace = grafting.directions_inplace(graft, 0.999, 1, [g.detach()], [tuple(a.clone() for a in acc)])[0]
    assert torch.equal(d.detach(), inplace)
    jac = torch.autograd.functional.jacobian(lambda x: grafting.direction(graft, 0.999, 1, x, acc)[1], g.detach())
    assert bool(torch.isfinite(jac).all())
    assert jac[0, 0].item() == pytest.approx(1 / grafting.EPS, rel=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(staleness=3, update_every=2, async_roots=True),
                                dict(graft="adam", beta2=0.99, block_size=3)])
def test_checkpoint_and_resume_reproduce_the_run(kw):
    """Stop after 5 steps (drain, to_plain), restore into a fresh optimizer's init state
    (from_plain checks the structure), continue 7 steps: parameters and state equal the
    uninterrupted run bit for bit, pending stale roots included."""
    shapes = [(7, 5), (5,)]
    seq = grads_seq(shapes, 12, seed=13)
    init = grads_seq(shapes, 1, seed=14)[0]
    full = tuple(p.clone() for p in init)
    opt = shampoo(lr=0.05, start_preconditioning_step=2, **kw)
    opt.start()
    final = run(opt, full, seq)
    opt.close()
    part = tuple(p.clone() for p in init)
    first = shampoo(lr=0.05, start_preconditioning_step=2, **kw)
    first.start()
    state = first.init(part)
    with torch.no_grad():
        for g in seq[:5]:
            state = first.commit(g, state, part)
    first.drain()
    plain = tree.to_plain(tree.clone(state))
    first.close()
    second = shampoo(lr=0.05, start_preconditioning_step=2, **kw)
    second.start()
    state = tree.from_plain(plain, second.init(part))
    with torch.no_grad():
        for g in seq[5:]:
            state = second.commit(g, state, part)
    second.close()
    assert all(torch.equal(a, b) for a, b in zip(full, part))
    assert all(torch.equal(a, b) for a, b in zip(tree.tensors(final), tree.tensors(state)))


@pytest.mark.parametrize("every,s", [(1, 0), (3, 0), (2, 1), (3, 2), (4, 7)])
def test_first_roots_are_used_when_the_shared_schedule_says(every, s):
    """The step from which the first roots change the update is the one
    ``shampoo_roots_due`` gives, the function the checker's W106 reads too: before it the
    roots are identities (with ``graft="none"`` and no momentum the update is ``−η·g``)."""
    from mloc.shared.roots import shampoo_roots_due
    seq = grads_seq([(4, 3)], every + s + 2, seed=9)
    opt = shampoo(lr=0.1, momentum=0.0, graft="none", start_preconditioning_step=0,
                  update_every=every, staleness=s)
    w = torch.zeros(4, 3, dtype=F64)
    state, first = opt.init((w,)), None
    for t, g in enumerate(seq, 1):
        upd, state = opt.update(g, state, (w,))
        if first is None and not torch.equal(upd[0], -0.1 * g[0]):
            first = t
    assert first == shampoo_roots_due(every, every, s) == every + s


def test_the_benchmarks_minimal_step_is_shampoos_step():
    """bench/shampoo.py's ``Minimal`` (a floor: the step hand-written on one flat buffer) is
    the same computation as mloc's default Shampoo with its roots still identities
    (AdaGrad grafting, Nesterov 0.9, preconditioned from step 1): 20 float64 steps on a
    matrix and a vector agree to rounding, so the floor it reports times the same work."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "bench" / "shampoo.py"
    spec = importlib.util.spec_from_file_location("bench_shampoo", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seq = grads_seq([(6, 4), (6,)], 20, seed=13)
    init = grads_seq([(6, 4), (6,)], 1, seed=14)[0]
    ours, minimal = tuple(p.clone() for p in init), [p.clone() for p in init]
    run(shampoo(lr=1e-2, update_every=10**9, start_preconditioning_step=0), ours, seq)
    m = bench.Minimal()
    state = m.init(minimal)
    for g in seq:
        state = m.commit(g, state, minimal, lr=1e-2)
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(ours, minimal))
    assert not torch.allclose(ours[0], init[0])


def test_the_root_worker_process_computes_what_root_work_computes(monkeypatch):
    """RootProcess alone: statistics of mixed dtypes and shapes (float32 and float64, batches
    of 1 and 3, odd byte sizes), two slots, jobs answered out of order: every root and
    status equals ``RootBatch.compute`` in this process bit for bit. Without
    PYTHONUNBUFFERED (set where this suite was written), so the worker's stdout is
    block-buffered as on a user's machine: every message must be flushed."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    from mloc.runtime.optim.rootproc import RootProcess
    from mloc.runtime.optim.rootbatch import RootBatch

    def spd(b, n, dtype, seed):
        x = torch.randn(b, n, 2 * n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
        return x @ x.transpose(-2, -1)
    jobs = [((spd(1, 3, torch.float32, s), spd(3, 5, torch.float32, s + 1)), (spd(2, 7, F64, s + 2),))
            for s in (0, 10)]
    ps = (4, 2)
    proc = RootProcess(1e-6, "auto")
    proc.start()
    try:
        assert proc.ready(60)
        fresh = [{"step": 0, "roots": None, "status": None} for _ in jobs]
        submitted = [proc.submit(slot, stats, ps, f) for slot, (stats, f) in enumerate(zip(jobs, fresh))]
        proc.wait(submitted[1])                      # reads slot 0's answer first
        proc.wait(submitted[0])
        assert proc.answered == 2
    finally:
        proc.close()
    for stats, got in zip(jobs, fresh):
        want = RootBatch(1e-6, "auto").compute(stats, ps)
        for key in ("roots", "status"):
            pairs = [(a, b) for ga, gb in zip(want[key], got[key]) for a, b in zip(ga, gb)]
            assert len(pairs) == 3 and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in pairs)


def test_on_a_gpu_machine_the_root_worker_starts_at_the_first_refresh_on_the_cpu(monkeypatch):
    """With CUDA available (faked: only the check) ``start`` does not spawn the worker (the
    statistics are likely on the GPU, where the thread serves); the first refresh of CPU
    statistics starts it, is computed in training meanwhile, and the run equals the
    synchronous one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seq = grads_seq([(6, 5), (5,)], 8, seed=15)
    init = grads_seq([(6, 5), (5,)], 1, seed=16)[0]
    kw = dict(lr=0.05, staleness=2, update_every=2, start_preconditioning_step=1, block_size=4)
    want_p, _, _ = run_async(kw, "sync", seq, init)
    opt = shampoo(async_roots=True, **kw)
    params = tuple(p.clone() for p in init)
    opt.start()
    try:
        assert opt.work.jobs._process is None
        state = opt.init(params)
        with torch.no_grad():
            for g in seq:
                state = opt.commit(g, state, params)
        assert opt.work.jobs._process is not None
    finally:
        opt.close()
    assert all(torch.equal(x, y) for x, y in zip(want_p, params))


def test_no_room_for_the_shared_files_falls_back_to_the_thread(monkeypatch):
    """A full /dev/shm (``posix_fallocate`` failing with ENOSPC, faked) is a warning and
    the thread, not a SIGBUS at a write into an unbacked page: the run equals the
    synchronous one."""
    import errno
    import os

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    seq = grads_seq([(6, 5), (5,)], 8, seed=17)
    init = grads_seq([(6, 5), (5,)], 1, seed=18)[0]
    kw = dict(lr=0.05, staleness=2, update_every=2, start_preconditioning_step=1, block_size=4)
    want_p, want_s, _ = run_async(kw, "sync", seq, init)
    with pytest.warns(MlocWarning, match="no room for the root worker's shared files"):
        got_p, got_s, answered = run_async(kw, "process", seq, init)
    assert answered == 0
    assert all(torch.equal(x, y) for x, y in zip(want_p, got_p))
    assert all(torch.equal(x, y) for x, y in zip(want_s, got_s))
