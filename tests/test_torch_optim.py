"""Any `torch.optim` optimizer as a problem's optimizer (docs/language.md, "Any
`torch.optim` optimizer"), against the same optimizer stepped by hand.

The program (tests/torch_optim/quad.mlo) is quadratic; its edge uses `first_order`, so the
upper's gradient is the direct ∂F/∂h, which a hand-written loop computes with the same
autograd operations. Both problems use `torch.optim.RAdam`; in float64 the program's
parameters after N outer steps must equal the hand loop's bit for bit.
"""

from __future__ import annotations

import ast as pyast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mloc
from mloc.passes.pipeline import compile_file, compile_source
from mloc.runtime.base import tree
from mloc.runtime.optim import torch_optimizer
from mloc.source import SourceFile

HERE = Path(__file__).parent / "torch_optim"
QUAD = HERE / "quad.mlo"
F64 = torch.float64
FIRST = "torch.optim.RAdam(lr=0.05, betas=(0.8, 0.99))"


def _quad():
    spec = importlib.util.spec_from_file_location("quad_ref", HERE / "quad.py")
    quad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quad)
    return quad


def hand(outer: int, low_opt, up_opt, unroll: int = 3, low_sched=None):
    """The program's schedule written out: `unroll` lower steps, then the upper's step on
    its direct gradient; each problem cycles through its own 8 batches."""
    quad = _quad()
    low = [b.double() for b in quad.points(seed=0)]
    up = [b.double() for b in quad.points(seed=1)]
    w = torch.zeros(3, dtype=F64, requires_grad=True)
    h = torch.full((3,), -0.5, dtype=F64, requires_grad=True)
    model, hyper = SimpleNamespace(w=w), SimpleNamespace(w=h)
    ow, oh = low_opt([w]), up_opt([h])
    sched = low_sched(ow) if low_sched else None
    k = 0
    for j in range(outer):
        for _ in range(unroll):
            (w.grad,) = torch.autograd.grad(quad.fit(model, hyper, low[k % 8]), w)
            ow.step()
            k += 1
            if sched is not None:
                sched.step()
        (h.grad,) = torch.autograd.grad(quad.val(model, hyper, up[j % 8]), h)
        oh.step()
    return w.detach(), h.detach()


def run(outer: int, *sets: str, path=QUAD):
    s = mloc.load(path, set=list(sets), dtype="float64")
    for _ in range(outer):
        s.step()
    return s.module("model").w.detach(), s.module("hyper").w.detach(), s


def radam(lr, **kw):
    return lambda ps: torch.optim.RAdam(ps, lr=lr, **kw)


def test_radam_program_equals_radam_by_hand_bit_for_bit():
    w, h, s = run(5)
    rw, rh = hand(5, radam(0.05, betas=(0.8, 0.99)), radam(0.02))
    assert torch.equal(w, rw) and torch.equal(h, rh)
    state = s.program.live["model"].problem.state
    assert state.count == 15 and set(state.per_param[0]) == {"step", "exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("spelling", ["torch.optim.NAdam(0.01, momentum_decay=0.002)",
                                      "torch(lr=0.01, cls=torch.optim.NAdam, momentum_decay=0.002)"])
def test_other_classes_and_the_registry_spelling(spelling):
    w, h, _ = run(3, f"model.optimizer={spelling}")
    rw, rh = hand(3, lambda ps: torch.optim.NAdam(ps, lr=0.01, momentum_decay=0.002), radam(0.02))
    assert torch.equal(w, rw) and torch.equal(h, rh)


def test_a_user_factory_by_its_module_path():
    w, h, _ = run(3, "model.optimizer=quad.make_optimizer(lr=0.5, rho=0.8)")
    rw, rh = hand(3, lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.8), radam(0.02))
    assert torch.equal(w, rw) and torch.equal(h, rh)


def test_a_user_factory_through_an_import_alias(tmp_path):
    text = QUAD.read_text().replace("import quad\n", "import quad as q\n").replace("quad.", "q.")
    text = text.replace(FIRST, "q.make_optimizer(lr=0.5, rho=0.8)")
    (tmp_path / "quad.py").write_text((HERE / "quad.py").read_text())
    (tmp_path / "alias.mlo").write_text(text)
    w, h, _ = run(3, path=tmp_path / "alias.mlo")
    rw, rh = hand(3, lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.8), radam(0.02))
    assert torch.equal(w, rw) and torch.equal(h, rh)


def test_a_checkpoint_resumes_bit_for_bit(tmp_path):
    _, _, first = run(2)
    first.save(tmp_path / "ckpt.pt")
    resumed = mloc.load(QUAD, dtype="float64")
    resumed.restore(tmp_path / "ckpt.pt")
    for _ in range(3):
        first.step()
        resumed.step()
    for name in ("model", "hyper"):
        assert torch.equal(first.module(name).w, resumed.module(name).w)
        a, b = (s.program.live[name].problem.state for s in (first, resumed))
        assert a.count == b.count
        assert all(torch.equal(x, y) for x, y in zip(tree.tensors(a), tree.tensors(b)))


def test_restoring_an_earlier_state_replays_the_same_steps(tmp_path):
    """A restore hands the optimizer a state it did not return last: it is loaded."""
    _, _, s = run(1)
    s.save(tmp_path / "one.pt")
    for _ in range(2):
        s.step()
    after = s.module("model").w.detach().clone()
    s.restore(tmp_path / "one.pt")
    for _ in range(2):
        s.step()
    assert torch.equal(s.module("model").w, after)


# --- the adapter on its own -------------------------------------------------------------

def _grads(seed, shapes, n):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, generator=g, dtype=F64) for s in shapes) for _ in range(n)]


SHAPES = [(3, 4), (4,), ()]


def _params():
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(s, generator=g, dtype=F64).requires_grad_() for s in SHAPES)


@pytest.mark.parametrize("cls,kw", [("torch.optim:RAdam", {}), ("torch.optim:Adagrad", {"lr_decay": 0.1}),
                                    ("torch.optim:Rprop", {}), ("torch.optim:SGD", {"momentum": 0.9}),
                                    ("torch.optim:AdamW", {"amsgrad": True})])
def test_commit_is_torch_optim_and_a_fresh_state_starts_again(cls, kw):
    ours, theirs = _params(), [p.detach().clone().requires_grad_() for p in _params()]
    opt = torch_optimizer(0.01, cls, kw)
    ref = getattr(torch.optim, cls.split(":")[1])(theirs, lr=0.01, **kw)
    state = opt.init(ours)
    for i, grads in enumerate(_grads(0, SHAPES, 6)):
        if i == 3:                                   # a restart: fresh state on both sides
            state, ref = opt.init(ours), getattr(torch.optim, cls.split(":")[1])(theirs, lr=0.01, **kw)
        with torch.no_grad():
            state = opt.commit(grads, state, ours)
        for p, g in zip(theirs, grads):
            p.grad = g
        ref.step()
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
        assert all(p.grad is None for p in ours)    # .grad is left as it was


def test_the_state_survives_a_plain_tree_round_trip():
    ours, twin = _params(), _params()
    opt, other = torch_optimizer(0.01, "torch.optim:Adam"), torch_optimizer(0.01, "torch.optim:Adam")
    state, fresh = opt.init(ours), other.init(twin)
    steps = _grads(3, SHAPES, 5)
    with torch.no_grad():
        for grads in steps[:2]:
            state = opt.commit(grads, state, ours)
        plain = tree.to_plain(tree.clone(state))
        loaded = tree.clone(tree.from_plain(plain, fresh))      # what a resume does
        for p, q in zip(twin, ours):
            p.copy_(q)
        for grads in steps[2:]:
            state = opt.commit(grads, state, ours)
            loaded = other.commit(grads, loaded, twin)
    assert all(torch.equal(a, b) for a, b in zip(ours, twin))


def test_a_tensor_learning_rate_is_read_at_every_step():
    lr = torch.tensor(0.1, dtype=F64)
    ours, theirs = _params(), [p.detach().clone().requires_grad_() for p in _params()]
    opt, ref = torch_optimizer(lr, "torch.optim:SGD"), torch.optim.SGD(theirs, lr=0.1)
    state = opt.init(ours)
    for i, grads in enumerate(_grads(4, SHAPES, 4)):
        lr.fill_(0.1 / (i + 1))
        ref.param_groups[0]["lr"] = 0.1 / (i + 1)
        with torch.no_grad():
            state = opt.commit(grads, state, ours)
        for p, g in zip(theirs, grads):
            p.grad = g
        ref.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_update_is_the_same_step_out_of_place():
    ours = _params()
    opt = torch_optimizer(0.01, "torch.optim:RAdam")
    state = opt.init(ours)
    before = tuple(p.detach().clone() for p in ours)
    for grads in _grads(5, SHAPES, 3):
        updates, _ = opt.update(grads, state, ours)
        assert all(torch.equal(p, b) for p, b in zip(ours, before))     # nothing moved
        with torch.no_grad():
            state = opt.commit(grads, state, ours)
        assert all(torch.allclose(b + u, p, rtol=0, atol=1e-15) for b, u, p in zip(before, updates, ours))
        before = tuple(p.detach().clone() for p in ours)


def test_refused_optimizers_say_why():
    with pytest.raises(TypeError, match="not a torch.optim.Optimizer"):
        torch_optimizer(0.1, _quad().not_an_optimizer).init(_params())
    with pytest.raises(TypeError, match="closure"):
        torch_optimizer(0.1, "torch.optim:LBFGS").init(_params())


# --- the checker --------------------------------------------------------------------------

def check(text: str):
    return compile_source(SourceFile(str(HERE / "p.mlo"), text))


@pytest.mark.parametrize("method,why", [("itd(steps=3)", "backpropagates through"),
                                        ("sama(eps=0.01)", "diagonal")])
def test_E401_below_itd_and_sama_says_why(method, why):
    text = QUAD.read_text().replace("first_order", method)
    (d,) = [d for d in check(text).diagnostics if d.code == "E401"]
    assert "`torch.optim.RAdam`" in d.message and "optimizer of `model`" in d.message
    assert "in place, outside autograd" in d.notes[0] and why in d.notes[0]


@pytest.mark.parametrize("method", ["cg", "neumann", "finite_diff", "first_order", "auto"])
def test_allowed_below_every_method_that_does_not_look_inside(method):
    unit = check(QUAD.read_text().replace("first_order", method))
    assert unit.ok, [d.message for d in unit.diagnostics]


def test_train_py_names_the_class_and_passes_the_options_through():
    assert compile_file(str(QUAD)).ok
    src = mloc.load(QUAD).source
    calls = {pyast.unparse(n) for n in pyast.walk(pyast.parse(src)) if isinstance(n, pyast.Call)}
    assert "torch_optimizer(lr=lr, cls='torch.optim:RAdam', options={'betas': (0.8, 0.99)})" in calls  # however wrapped
    assert "torch_optimizer(lr=lr, cls='torch.optim:RAdam', options={})" in calls
