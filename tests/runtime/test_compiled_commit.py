"""``Optimizer.compiled_commit``: the commit with its tensor work under ``torch.compile``
(``mloc.runtime.optim.compiled``) agrees with the eager commit, keeps the state's layout
(checkpoints pass between the two), compiles once or twice and never again in steady state
(a step count and a schedule's rate changing every step, Shampoo's roots replaced at every
install), and where it cannot compile runs the eager commit and says why.

Open loop (``compiled_runs``): both commits see the same gradients. The default tier
compiles one optimizer once, in a module fixture shared by its tests (a blocked,
stale-rooted Shampoo with ``adam`` grafting under a schedule; ~10 s with a cold Inductor
cache, most of it the process's first compile), and a commit that cannot compile (traced,
not compiled); the slow tier runs Adam under a schedule, and every registry entry and
variant in float64 and float32."""

from __future__ import annotations

import pytest
import torch

from mloc.runtime.base import tree
from mloc.runtime.optim import Optimizer, commit_present
from mloc.runtime.optim.compiled import CompiledCommit

from tests.runtime.compiled_runs import (TOLERANCE, build, configs, floating, gradients, layout, parameters, rates,
                                         relative, run)

F32, F64 = torch.float32, torch.float64


class Scheduled:
    """An optimizer under a schedule (its rate a 0-dim tensor rewritten before each
    commit): its eager and compiled runs, the graphs compiled after each step, and
    checkpoints (plain trees, with the parameters) after step 50."""

    def __init__(self, name, dtype, **kwargs):
        self.dtype = dtype
        self.opt = build(name, **kwargs)
        self.set_rate = self.opt.scheduled_rate(dtype, torch.device("cpu"))
        self.commit = self.opt.compiled_commit()
        self.compiles_at: dict[int, int] = {}
        self.eager, self.eager_at_50 = self._run(self.opt.commit)
        self.compiled, self.compiled_at_50 = self._run(self.commit)

    def _run(self, commit):
        checkpoint = {}

        def watch(step, state, params):
            if commit is self.commit:
                self.compiles_at[step] = self.commit.compiles
            if step == 49:
                checkpoint.update(state=tree.to_plain(tree.clone(state)), params=tree.clone(params))
        return run(self.opt, commit, self.dtype, schedule=self.set_rate, watch=watch), checkpoint

    def resumed(self, commit, checkpoint):
        """Steps 50 … 99 with ``commit`` from ``checkpoint``, restored as a run restores one
        (into a fresh ``init``'s structure)."""
        state = tree.from_plain(tree.clone(checkpoint["state"]), self.opt.init(parameters(self.dtype)))
        params = [p.clone().requires_grad_(True) for p in checkpoint["params"]]
        return run(self.opt, commit, self.dtype, start=50, params=params, state=state, schedule=self.set_rate)


SCHEDULED = {"adam": ("adam", {}),
             "shampoo": ("shampoo", dict(graft="adam", block_size=16, update_every=3, staleness=2,
                                         start_preconditioning_step=4, root_method="eigh"))}


@pytest.fixture(scope="module")
def shampoo():
    """The default tier's compiled optimizer: Shampoo under a schedule, float32, 100 steps
    each way, shared by the tests below (Adam's are in the slow tier)."""
    name, kwargs = SCHEDULED["shampoo"]
    return Scheduled(name, F32, **kwargs)


def agrees(s: Scheduled) -> None:
    assert s.commit.reason is None and s.commit.compiled
    (p_e, s_e), (p_c, s_c) = s.eager, s.compiled
    assert relative(p_e, p_c) <= TOLERANCE[F32]
    assert relative(floating(s_e), floating(s_c)) <= TOLERANCE[F32]


def compiles_by_step_2(s: Scheduled) -> None:
    """The rate changes at every step, the count too, and Shampoo installs new roots every
    3 steps from step 5 on (and starts preconditioning at step 5): one graph, or two, all
    compiled by step 2."""
    assert 1 <= s.compiles_at[1] <= 2
    assert s.commit.compiles == s.compiles_at[99] == s.compiles_at[1]
    assert s.commit.recompiles == s.compiles_at[1] - 1
    assert s.commit.compile_seconds > 0


def resumes_across(s: Scheduled) -> None:
    """A state written by one commit is read by the other (the same layout: a checkpoint's
    plain tree, shapes and dtypes, an int count) and training continues to what an
    uninterrupted eager run reaches, without a new graph."""
    assert layout(s.eager[1]) == layout(s.compiled[1])
    assert type(s.compiled[1].count) is int and s.compiled[1].count == 100
    compiles = s.commit.compiles
    for commit, checkpoint in ((s.opt.commit, s.compiled_at_50), (s.commit, s.eager_at_50)):
        params, state = s.resumed(commit, checkpoint)
        assert relative(s.eager[0], params) <= TOLERANCE[F32]
        assert relative(floating(s.eager[1]), floating(state)) <= TOLERANCE[F32]
    assert s.commit.compiles == compiles


def test_a_scheduled_compiled_commit_agrees_with_the_eager_one(shampoo):
    agrees(shampoo)


def test_no_recompile_after_the_second_step(shampoo):
    compiles_by_step_2(shampoo)


def test_checkpoints_pass_between_eager_and_compiled_commits(shampoo):
    resumes_across(shampoo)


def test_commit_present_takes_the_compiled_commit(shampoo):
    """A parameter no gradient reached (its gradient zeros) ends as it was, with its state
    entries, through the compiled commit as through the eager one; the rest agree. The
    fixture's compiled commit serves a fresh run: no new graph."""
    compiles, absent = shampoo.commit.compiles, (1,)
    ends = []
    for commit in (shampoo.opt.commit, shampoo.commit):
        params = parameters(F32)
        state = shampoo.opt.init(params)
        before = (params[1].detach().clone(), tree.clone(state.graft[1]), tree.clone(state.momentum[1]))
        for step in range(8):
            shampoo.set_rate(rates(step))
            grads = tuple(torch.zeros_like(g) if i in absent else g for i, g in enumerate(gradients(step, F32)))
            with torch.no_grad():
                state = commit_present(shampoo.opt, grads, state, params, absent, commit)
        assert torch.equal(params[1], before[0])
        assert all(torch.equal(a, b) for a, b in zip(tree.tensors((state.graft[1], state.momentum[1])),
                                                     tree.tensors(before[1:])))
        ends.append((params, state))
    (p_e, s_e), (p_c, s_c) = ends
    assert relative(p_e, p_c) <= TOLERANCE[F32] and relative(floating(s_e), floating(s_c)) <= TOLERANCE[F32]
    assert shampoo.commit.compiles == compiles


@pytest.mark.slow
def test_adam_under_a_schedule_compiles_once_agrees_and_resumes():
    name, kwargs = SCHEDULED["adam"]
    s = Scheduled(name, F32, **kwargs)
    agrees(s)
    compiles_by_step_2(s)
    resumes_across(s)


def test_a_torch_optim_optimizer_is_not_compiled_and_says_why():
    opt, ref = build("torch", cls="torch.optim:RAdam"), build("torch", cls="torch.optim:RAdam")
    commit = opt.compiled_commit()
    assert isinstance(commit, CompiledCommit) and not commit.compiled
    assert "torch.optim" in commit.reason and commit.compiles == commit.recompiles == 0
    p_e, _ = run(ref, ref.commit, F32, steps=5)
    p_c, _ = run(opt, commit, F32, steps=5)
    assert all(torch.equal(a, b) for a, b in zip(p_e, p_c))


class HostClipped(Optimizer):
    """SGD that halves a step whose largest gradient entry exceeds 1, deciding on the host
    (data-dependent Python control flow): a graph break, which ``fullgraph`` refuses."""

    def init(self, params):
        return 0

    def update(self, grads, state, params):
        scale = 0.05 if max(g.abs().max() for g in grads) > 1 else 0.1
        return tuple(-scale * g for g in grads), state + 1


def test_an_untraceable_commit_runs_eagerly_with_the_compilers_reason():
    opt = HostClipped()
    commit = opt.compiled_commit()
    assert commit.compiled                       # not known before the first call
    p_e, _ = run(HostClipped(), HostClipped().commit, F64, steps=3)
    p_c, state = run(opt, commit, F64, steps=3)
    assert not commit.compiled and commit.reason.startswith("HostClipped_commit")
    assert "Unsupported: Data-dependent branching" in commit.reason and state == 3 and commit.compiles == 0
    assert all(torch.equal(a, b) for a, b in zip(p_e, p_c))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("config", sorted(configs()))
def test_every_builtin_optimizers_compiled_commit_agrees_with_its_eager_commit(config, dtype):
    """Every registry entry (its defaults) and variant, 100 steps: the parameters and every
    floating tensor of the state within :data:`TOLERANCE`, the same layout, and no graph
    compiled after step 2 (the Shampoo variants install new roots every 4 steps, with
    staleness 0, 3 and 4, synchronous and in a worker process)."""
    name, kwargs = configs()[config]
    eager, opt = build(name, **kwargs), build(name, **kwargs)
    commit = opt.compiled_commit()
    compiles_at = {}
    p_e, s_e = run(eager, eager.commit, dtype)
    p_c, s_c = run(opt, commit, dtype, watch=lambda step, *_: compiles_at.setdefault(step, commit.compiles))
    assert layout(s_e) == layout(s_c)
    if name == "torch":
        assert commit.reason is not None and commit.compiles == 0
        assert all(torch.equal(a, b) for a, b in zip(p_e, p_c))
        return
    assert commit.reason is None
    assert relative(p_e, p_c) <= TOLERANCE[dtype]
    assert relative(floating(s_e), floating(s_c)) <= TOLERANCE[dtype]
    assert 1 <= commit.compiles == compiles_at[1] <= 2


class Decaying(Optimizer):
    """SGD whose rate, a Python float in its state, decays by 0.9 per step and is given to
    a kernel as its scalar (``addcmul_``'s ``value``): a constant to the compiler, so every
    step compiles another graph (what ``host_numbers`` avoids)."""

    def init(self, params):
        return 0.1

    def update(self, grads, state, params):
        return tuple(-state * g for g in grads), state * 0.9

    def commit(self, grads, state, params):
        for p, g in zip(params, grads):
            p.addcmul_(g, torch.ones_like(g), value=-state)
        return state * 0.9


@pytest.mark.slow
def test_a_commit_that_recompiles_every_step_turns_eager_at_the_recompile_limit():
    """Past Dynamo's recompile limit a function runs uncompiled, silently; the region
    stops there itself and says so."""
    from torch._dynamo.config import recompile_limit
    opt = Decaying()
    commit = opt.compiled_commit()
    p_e, _ = run(Decaying(), Decaying().commit, F64, steps=recompile_limit + 4)
    p_c, state = run(opt, commit, F64, steps=recompile_limit + 4)
    assert commit.compiles == recompile_limit and state == pytest.approx(0.1 * 0.9 ** (recompile_limit + 4))
    assert "recompile_limit" in commit.reason
    assert relative(p_e, p_c) <= TOLERANCE[F64]


@pytest.mark.slow
def test_a_compiled_commit_called_in_a_callers_compiled_function_is_traced_into_it():
    """Under a caller's ``torch.compile`` (the engine's compiled step) a region is inlined
    into the caller's graph, compiling none of its own; the results are the eager ones."""
    opt, ref = build("adam"), build("adam")
    commit = opt.compiled_commit()
    outer = torch.compile(lambda grads, state, params: commit(grads, state, params), fullgraph=True)
    p_e, s_e = run(ref, ref.commit, F32, steps=10)
    p_c, s_c = run(opt, outer, F32, steps=10)
    assert relative(p_e, p_c) <= TOLERANCE[F32] and relative(floating(s_e), floating(s_c)) <= TOLERANCE[F32]
    assert commit.compiles == 0 and commit.reason is None
