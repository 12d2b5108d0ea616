"""Bind user losses, written over modules, to the runtime's functional calling convention.

A `.mlo` loss is ordinary Python over the problems' `torch.nn.Module`s:
`lib.weighted_ce(classifier, weight_net, batch)`. The runtime calls a loss as
`loss(*params)`, one parameter tuple per problem it reads, because hypergradient methods
evaluate it at points that are not the modules' own parameters (θ ± εv, unrolled θ_k, or
θ_meta + δ for a problem that starts from another's weights). `BoundLoss` bridges the two
by substituting the tensors into the modules for the duration of the call, as
`torch.func.functional_call` does, so attribute access inside the user's code
(`model.linear.weight`, `module.parameters()`) also sees the substituted tensors. When
every tuple passed is the modules' own parameters (plain training steps), the user's
function is called directly.

The substitution is specialized once per loss (:class:`_Slots`): every place a parameter
lives (its submodule's ``_parameters`` dict and key, tied aliases included) is found at
construction, so a call swaps the tensors in and out with a few dictionary writes. That
is `functional_call`'s own mechanism (``swap_tensor``) without its per-call walk over
every submodule, name resolution and tie detection, several hundred Python calls per
hypergradient step that a hand-written loop pays too. Modules with parametrizations
(`torch.nn.utils.parametrize`) go through `functional_call`, which handles them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

Params = tuple[Tensor, ...]


class _Container(nn.Module):
    """Every module a loss reads, as submodules `m0, m1, ...`; forward calls the loss."""

    def __init__(self, fn: Callable, modules: Sequence[nn.Module]):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(modules)

    def forward(self, *extra):
        return self.fn(*self.mods, *extra)


class _Slots:
    """Where each substituted tensor goes: per value, every ``(submodule._parameters, attr)``
    pair it replaces (a tied parameter lives in several). :meth:`of` finds them once for
    keys ``mods.i.name`` of a container."""

    def __init__(self, places: Sequence[tuple[tuple[dict, str], ...] | None]):
        self.places = list(places)
        self.complete = all(p is not None for p in self.places)

    @classmethod
    def of(cls, container: nn.Module, keys: Sequence[str]) -> "_Slots":
        places: dict[int, list[tuple[dict, str]]] = {}
        for module in container.modules():      # each module once (a shared one too)
            for attr, t in module._parameters.items():
                if t is not None:
                    places.setdefault(id(t), []).append((module._parameters, attr))
        named = dict(container.named_parameters(remove_duplicate=False))
        return cls([tuple(places[id(named[k])]) if k in named else None for k in keys])

    def call(self, fn: Callable, args: tuple, values: Sequence[Tensor]):
        """``fn(*args)`` with the tensors at ``keys`` replaced by ``values``; the modules'
        own parameters are put back afterwards, also when ``fn`` raises."""
        saved = []
        try:
            for places, v in zip(self.places, values):
                for d, attr in places:
                    saved.append((d, attr, d[attr]))
                    d[attr] = v
            return fn(*args)
        finally:
            for d, attr, t in reversed(saved):
                d[attr] = t


class BoundLoss:
    """`loss(*params)` for the runtime; `params[i]` are the parameters of `reads[i]`.

    `slots[i]` names the parameters of module `reads[i]` that a tuple replaces (the
    problem's trainable ones, in order). `offsets` maps a read index to the index of the
    tuple added to it: a problem with `init = U` is evaluated at θ_U + δ (MAML's inner
    parameters written as the meta parameters plus an adaptation).
    `batch_of` returns the extra arguments (the current batch) at call time.
    """

    def __init__(self, fn: Callable, modules: Sequence[nn.Module], slots: Sequence[Sequence[str]],
                 own: Sequence[Params], batch_of: Callable[[], tuple], offsets: dict[int, int] | None = None,
                 module_count: int | None = None):
        self.container = _Container(fn, modules)
        count = len(modules) if module_count is None else module_count
        self.keys = [tuple(f"mods.{i}.{s}" for s in slots[i]) for i in range(count)]
        self.owned = [p if type(p) is tuple else tuple(p) for p in own]   # keep identities
        self.batch_of = batch_of
        self.watch = None   # called around each forward: see `mloc.runtime.grad.buffers.OwnForward`
        self.offsets = dict(offsets or {})
        self.fn, self.modules = fn, tuple(modules)
        flat = [k for keys in self.keys for k in keys]
        slots = _Slots.of(self.container, flat)
        parametrized = any(torch.nn.utils.parametrize.is_parametrized(m) for m in self.container.modules())
        self._slots = slots if slots.complete and not parametrized else None

    def _is_own(self, params: Sequence[Params]) -> bool:
        if self.offsets:
            return False
        for given, own in zip(params, self.owned):
            if given is own:    # the problems' own tuples, as the training steps pass them
                continue
            if len(given) != len(own) or any(a is not b for a, b in zip(given, own)):
                return False
        return True

    def own(self) -> Tensor:
        """The loss at the problems' own parameters (what a plain training step evaluates):
        the user's function on the modules themselves, with no check of the arguments."""
        if self.offsets:
            return self(*self.owned)
        return self.fn(*self.modules, *self.batch_of())

    def own_with_constants(self, index: int) -> Callable[[], Tensor] | None:
        """``own()`` for a plain training step of read ``index``: the loss at the problems'
        own parameters, with the parameters of every *other* module it reads (those that
        require grad) bound as constants, detached aliases made once (they share storage,
        so they follow in-place optimizer steps). A step differentiates its own parameters
        only, so autograd then records nothing for the other modules' layers (in
        Meta-Weight-Net, the weight net's forward in every classifier step); the gradient
        is the same tensor operation for operation. ``None`` when there is nothing to bind
        (no other module has such parameters) or the substitution does not apply (an
        ``init`` offset, a parametrized module, a parameter shared with read ``index``)."""
        if self.offsets or self._slots is None:
            return None
        mine = {id(t) for t in self.modules[index].parameters()}
        places, aliases = [], []
        for i, module in enumerate(self.modules):
            if i == index:
                continue
            for sub in module.modules():
                for attr, t in sub._parameters.items():
                    if t is None or not t.requires_grad:
                        continue
                    if id(t) in mine:
                        return None
                    places.append((sub._parameters, attr))
                    aliases.append(t.detach())
        if not places:
            return None
        slots, fn, modules, batch_of = _Slots([(p,) for p in places]), self.fn, self.modules, self.batch_of

        def loss() -> Tensor:
            return slots.call(fn, (*modules, *batch_of()), aliases)
        return loss

    def step_loss(self, index: int | None) -> Callable[[], Tensor]:
        """The loss at the problems' own parameters, as a closure bound once for a plain
        training step of read ``index`` (None: the stepped problem is not read): with the
        other modules' parameters as constants (:meth:`own_with_constants`) where that
        applies, else the user's function on the modules, called directly, else (an
        ``init`` offset) :meth:`own`."""
        if index is not None and index < len(self.modules):
            constant_others = self.own_with_constants(index)
            if constant_others is not None:
                return constant_others
        if self.offsets:
            return self.own
        fn, modules, batch_of = self.fn, self.modules, self.batch_of

        def loss() -> Tensor:
            return fn(*modules, *batch_of())
        return loss

    def __call__(self, *params: Params) -> Tensor:
        if self.watch is not None:
            self.watch.before()
        extra = self.batch_of()
        if self._is_own(params):
            loss = self.fn(*self.modules, *extra)
        else:
            values: list[Tensor] = []
            for i in range(len(self.keys)):
                given = params[i]
                if i in self.offsets:
                    base = params[self.offsets[i]]
                    given = tuple(b + d for b, d in zip(base, given))
                values.extend(given)
            if self._slots is not None:
                loss = self._slots.call(self.fn, (*self.modules, *extra), values)
            else:
                mapping = dict(zip((k for keys in self.keys for k in keys), values))
                loss = torch.func.functional_call(self.container, mapping, extra, strict=False)
        if self.watch is not None:
            self.watch.after()
        return loss


def select_parameters(module: nn.Module, trainable: Sequence[str], frozen: Sequence[str]) -> list[str]:
    """Names of `module`'s parameters matching a `trainable` glob and no `frozen` glob."""
    from fnmatch import fnmatchcase

    names = [n for n, _ in module.named_parameters()]
    keep = [n for n in names if any(fnmatchcase(n, g) for g in trainable)
            and not any(fnmatchcase(n, g) for g in frozen)]
    return keep
