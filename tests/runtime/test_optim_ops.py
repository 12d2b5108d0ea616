"""Each optimizer's step is written once, in the algebra of ``mloc.runtime.optim.ops``, and
run by two interpreters: ``update`` (functional) and ``commit`` (in place) call the same
operations in the same order, and the two interpreters agree on every operation: bitwise
for ``ops.EXACT``, to a few units in the last place for the others (float64)."""

from __future__ import annotations

import importlib

import pytest
import torch

from mloc.runtime.optim import adam, adamw, ops, sgd, shampoo

# the modules (the package's names `adam`, `sgd`, `shampoo` are the factories)
adam_module, graft_module, sgd_module, shampoo_module = (
    importlib.import_module(f"mloc.runtime.optim.{m}") for m in ("adam", "graft", "sgd", "shampoo"))

F64 = torch.float64
SHAPES = [(6, 5), (5,), (3, 4, 2)]


def column(seed, positive=False):
    gen = torch.Generator().manual_seed(seed)
    col = [torch.randn(s, dtype=F64, generator=gen) for s in SHAPES]
    return [c.abs() + 0.1 for c in col] if positive else col


# every operation of the vocabulary, with arguments: (columns, by position; numbers)
ARGS = {
    "add": lambda: (column(1), column(2), 0.3),
    "div": lambda: (column(1), column(2, True)),
    "sqrt": lambda: (column(1, True),),
    "safe_sqrt": lambda: (column(1, True),),
    "copy": lambda: (column(1),),
    "bias_root": lambda: (column(1, True), 0.271),
    "div_bias": lambda: (column(1), column(2, True), 0.19),
    "add_": lambda: (column(1), 1e-8),
    "ema_": lambda: (column(1), column(2), 0.9),
    "ema_lerp_": lambda: (column(1), column(2), 0.9),
    "momentum_": lambda: (column(1), column(2), 0.9, 0.1),
    "ema_sq_": lambda: (column(1, True), column(2), 0.999),
    "add_sq_": lambda: (column(1, True), column(2)),
    "rescale_": lambda: (column(1), column(2), 1e-16),
    "step": lambda: (column(1), column(2), 0.05, (0.05, 0.01)),
    "step_div": lambda: (column(1), column(2), column(3, True), 0.05, (0.05, 0.01)),
    "step_nesterov": lambda: _nesterov_args(column(1), column(2), column(3), 0.9),
}


def _nesterov_args(p, d, b, mu):
    """``step_nesterov``'s arguments: its in-place form relies on ``b_new = μb + d``."""
    return p, d, b, [mu * bi + di for bi, di in zip(b, d)], mu, 0.05, (0.05, 0.01)


def _fresh(args):
    return tuple([t.clone() for t in a] if isinstance(a, list) else a for a in args)


def test_the_vocabulary_is_one_list_for_every_interpreter():
    names = {n for n in vars(ops.Functional) if not n.startswith("_") and n != "inplace"}
    assert names == set(ARGS)
    assert ops.EXACT <= names
    for name in names:
        assert callable(getattr(ops.INPLACE, name)) and callable(getattr(ops.FOREACH, name))


@pytest.mark.parametrize("name", sorted(ARGS))
@pytest.mark.parametrize("inplace", [ops.INPLACE, ops.FOREACH], ids=["tensorwise", "foreach"])
def test_each_operation_means_the_same_under_both_interpreters(name, inplace):
    args = ARGS[name]()
    functional = getattr(ops.FUNCTIONAL, name)(*_fresh(args))
    written = _fresh(args)
    result = getattr(inplace, name)(*written)
    if name.startswith("step"):         # the functional form gives updates, the other writes θ
        assert result is None
        functional = [p + u for p, u in zip(args[0], functional)]
        result = written[0]
    elif name.endswith("_"):            # in place: the first argument, overwritten
        assert all(r is w for r, w in zip(result, written[0]))
    for f, r in zip(functional, result):
        if name in ops.EXACT:
            assert torch.equal(f, r), name
        else:
            torch.testing.assert_close(r, f, rtol=4e-15, atol=1e-16)


class Recorder:
    """An interpreter that records the name of every operation it is asked for."""

    def __init__(self, inner, log):
        self.inner, self.log, self.inplace = inner, log, inner.inplace

    def __getattr__(self, name):
        self.log.append(name)
        return getattr(self.inner, name)


OPTIMIZERS = {
    "sgd": (lambda: sgd(lr=0.1), [sgd_module]),
    "sgd-momentum-wd": (lambda: sgd(lr=0.1, momentum=0.9, weight_decay=1e-2, dampening=0.1), [sgd_module]),
    "sgd-nesterov": (lambda: sgd(lr=0.1, momentum=0.9, nesterov=True), [sgd_module]),
    "adam-wd": (lambda: adam(lr=1e-2, weight_decay=1e-2), [adam_module]),
    "adamw": (lambda: adamw(lr=1e-2, weight_decay=1e-2), [adam_module]),
    **{f"shampoo-{g}": (lambda g=g: shampoo(lr=0.05, graft=g, weight_decay=1e-2, start_preconditioning_step=1,
                                            block_size=4, root_method="eigh"),
                        [shampoo_module, graft_module])
       for g in ("adagrad", "rmsprop", "adam", "sgd")},
    "shampoo-heavy-ball-coupled": (lambda: shampoo(lr=0.05, nesterov=False, weight_decay=1e-2,
                                                   decoupled_weight_decay=False, start_preconditioning_step=1,
                                                   root_method="eigh"), [shampoo_module, graft_module]),
}


def _run(opt, inplace, steps=3):
    params = column(5)
    state = opt.init(params)
    for s in range(steps):
        grads = column(10 + s)
        if inplace:
            with torch.no_grad():
                state = opt.commit(grads, state, params)
        else:
            updates, state = opt.update(grads, state, params)
            params = [p + u for p, u in zip(params, updates)]
    return params, state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_and_commit_run_one_step_definition(name, monkeypatch):
    """``update`` and ``commit`` ask their interpreters for the same operations in the same
    order (one definition), and end at the same parameters and state, to rounding."""
    make, modules = OPTIMIZERS[name]
    logs = {}
    for inplace in (False, True):
        log = logs[inplace] = []
        for module in modules:
            for attr in ("FUNCTIONAL", "INPLACE", "FOREACH"):
                if hasattr(module, attr):
                    monkeypatch.setattr(module, attr, Recorder(getattr(ops, attr), log))
        logs[inplace, "result"] = _run(make(), inplace)
        monkeypatch.undo()
    assert logs[False] and logs[False] == logs[True]
    assert any(op.startswith("step") for op in logs[False])
    (p_f, s_f), (p_i, s_i) = logs[False, "result"], logs[True, "result"]
    for a, b in zip(p_f, p_i):
        torch.testing.assert_close(b, a, rtol=1e-13, atol=1e-15)
    moments = [(a, b) for a, b in zip(_tensors(s_f), _tensors(s_i))]
    assert all(a.shape == b.shape for a, b in moments)
    for a, b in moments:
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def _tensors(state):
    from mloc.runtime.base import tree
    return [t for t in tree.tensors(state) if t.is_floating_point()]
