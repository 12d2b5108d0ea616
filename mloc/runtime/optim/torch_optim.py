r"""Any ``torch.optim`` optimizer, or a factory returning one, as an :class:`Optimizer`.

``torch_optimizer(lr, cls="torch.optim:RAdam", options={...})`` builds
``cls(params, lr=lr, **options)`` on the problem's parameters the first time it sees them
and steps it in place: :meth:`TorchOptimizer.commit` writes the gradients into ``.grad``,
calls ``step()`` and puts the old ``.grad`` back. A run is therefore bit-identical to the
same ``torch.optim`` optimizer stepped by hand on the same gradients.

The state is a :class:`TorchState`: the number of steps taken and, per parameter, the
dict ``torch.optim`` keeps for it (``optimizer.state[p]``; its tensors are the live ones,
which the next step overwrites in place, as :meth:`Optimizer.commit` allows). A fresh
state (count 0) clears ``torch.optim``'s, which the next step re-initialises lazily as
``torch.optim`` always does; its per-parameter dicts are a template with the structure the
first step creates (found once by a step on zero copies of the parameters), so a
checkpoint written after any number of steps restores into a freshly built program's
state (:func:`mloc.runtime.base.tree.from_plain` checks the structure). When the state handed
to ``commit`` is not the one it returned last (a restore, a restart), it is loaded into
the optimizer first.

The learning rate: a number stays as built; a 0-dim tensor (what a schedule rewrites
before each commit) is read (``.item()``) and written into every parameter group before
each step, and so are the other param-group entries a ``torch.optim.lr_scheduler`` drives
(:meth:`TorchOptimizer.drive`: OneCycleLR's momentum cycling writes ``betas`` or
``momentum``), as that scheduler writes them into a hand-written loop's optimizer; the
scheduler itself steps the same class built on a dummy tensor
(:meth:`TorchOptimizer.schedule_stand_in`). Not differentiable and no SAMA diagonal (its descriptor says so, and the
checker refuses ``itd`` and ``sama`` below it); :meth:`update` is the same step on copies,
for the interface. Optimizers whose ``step`` needs a closure (``LBFGS``) are not supported.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from mloc.shared.hyper import TorchHyper
from mloc.runtime.optim.base import Optimizer, takes
from mloc.runtime.base.tree import Params


def load_ref(path: str | Callable) -> Callable:
    """The object ``"module:attr"`` names (``attr`` may be dotted); a callable as it is."""
    if callable(path):
        return path
    module, _, attr = str(path).partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class TorchState(NamedTuple):
    count: int              # steps taken since init
    per_param: tuple        # per parameter, torch.optim's state dict for it


class TorchOptimizer(Optimizer):
    """See the module docstring."""

    unfused = "a torch.optim optimizer steps in place on .grad: mloc runs its step() eagerly, as it is"

    def __init__(self, hyper: TorchHyper):
        super().__init__(hyper)
        self.options, self.factory = dict(hyper.options or {}), load_ref(hyper.cls)
        self.name = getattr(self.factory, "__qualname__", str(hyper.cls))
        self._opt: torch.optim.Optimizer | None = None
        self._params: Params = ()
        self._template: tuple | None = None
        self._live: TorchState | None = None
        self._scheduled: dict = {}           # param-group entries a scheduler drives: this step's values

    def _host_lr(self) -> float:
        """The rate as a host float (torch.optim's groups hold floats): a scheduled rate is
        a 0-dim tensor the engine rewrote, read here once per step (a device sync off the
        CPU, the one this optimizer costs)."""
        lr = self.hyper.lr
        return lr.item() if isinstance(lr, Tensor) else lr

    def _build(self, params, lr: float | None = None) -> torch.optim.Optimizer:
        opt = self.factory(list(params), lr=self._host_lr() if lr is None else lr, **self.options)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"{self.name}(params, lr=..., ...) returned a {type(opt).__name__}, "
                            "not a torch.optim.Optimizer")
        return opt

    def _bind(self, params: Params) -> None:
        if len(params) == len(self._params) and all(a is b for a, b in zip(params, self._params)):
            return
        self._opt, self._params, self._template, self._live = self._build(params), params, None, None

    def schedule_stand_in(self, lr: float) -> torch.optim.Optimizer:
        """This very class on one dummy tensor, rate ``lr``: a scheduler reads its real
        ``defaults`` (``betas`` or ``momentum``; neither: torch refuses to cycle a momentum)."""
        return self._build([torch.zeros(1, requires_grad=True)], lr)

    def drive(self, keys, like=None):
        """``set(values)`` keeps one step's values of the entries ``keys``, written into every
        param group before the next ``step()`` (host numbers, as ``torch.optim`` holds them)."""
        def set_values(step_values: dict) -> None:
            self._scheduled.update(step_values)
        return set_values

    def _probe(self, params: Params) -> tuple:
        """The structure of the state after one step: one step on zero copies."""
        shadow = [torch.zeros_like(p) for p in params]
        for s in shadow:
            s.grad = torch.zeros_like(s)
        opt = self._build(shadow)
        try:
            opt.step()
        except TypeError as e:
            raise TypeError(f"{self.name}.step() needs arguments ({e}); an optimizer whose step "
                            "takes a closure (LBFGS) is not supported") from None
        return tuple(dict(opt.state[s]) for s in shadow)

    def init(self, params):
        params = tuple(params)
        self._bind(params)
        if self._template is None:
            self._template = self._probe(params)
        return TorchState(0, self._template)

    def _load(self, opt: torch.optim.Optimizer, params, state: TorchState) -> None:
        opt.state.clear()
        if state.count:
            for p, s in zip(params, state.per_param):
                opt.state[p] = dict(s)

    def _step(self, opt: torch.optim.Optimizer, params, grads) -> None:
        if isinstance(self.hyper.lr, Tensor):
            lr = self._host_lr()
            for group in opt.param_groups:
                group["lr"] = lr
        for group in opt.param_groups:
            group.update(self._scheduled)
        kept = [p.grad for p in params]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        for p, g in zip(params, kept):
            p.grad = g

    def commit(self, grads, state, params):
        """One ``step()`` of the wrapped optimizer, in place (see the module docstring)."""
        params = tuple(params)
        self._bind(params)
        if state is not self._live:
            self._load(self._opt, params, state)
        self._step(self._opt, params, grads)
        self._live = TorchState(state.count + 1, tuple(dict(self._opt.state[p]) for p in params))
        return self._live

    def compiled_commit(self):
        """The eager :meth:`commit`, with the reason: the step is ``torch.optim``'s, whose
        in-place ``step()`` on ``.grad`` mloc does not compile."""
        from mloc.runtime.optim.compiled import eager_commit
        return eager_commit(self, f"{self.name} is a torch.optim optimizer: mloc runs its step() "
                                  "eagerly, as it is")

    def update(self, grads, state, params):
        """The same step on detached copies: ``(new - params, new_state)``; not
        differentiable, and ``params + updates`` may differ from the in-place step in the
        last bit."""
        with torch.no_grad():
            shadow = [p.detach().clone() for p in params]
            opt = self._build(shadow)
            copied = TorchState(state.count, tuple({k: v.clone() if isinstance(v, Tensor) else v
                                                    for k, v in s.items()} for s in state.per_param))
            self._load(opt, shadow, copied)
            self._step(opt, shadow, tuple(g.detach() for g in grads))
            updates = tuple(s - p.detach() for s, p in zip(shadow, params))
            return updates, TorchState(state.count + 1, tuple(dict(opt.state[s]) for s in shadow))


@takes(TorchHyper)
def torch_optimizer(hyper: TorchHyper) -> TorchOptimizer:
    """``cls(params, lr=lr, **options)``, a ``torch.optim`` optimizer (or a factory returning
    one; ``cls`` as ``"module:attr"`` or the object) stepped in place (see
    :class:`TorchOptimizer`)."""
    return TorchOptimizer(hyper)
