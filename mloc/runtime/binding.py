"""Bind user losses, written over modules, to the runtime's functional calling convention.

A `.mlo` loss is ordinary Python over the problems' `torch.nn.Module`s:
`lib.weighted_ce(classifier, weight_net, batch)`. The runtime calls a loss as
`loss(*params)`, one parameter tuple per problem it reads, because hypergradient methods
evaluate it at points that are not the modules' own parameters (θ ± εv, unrolled θ_k, or
θ_meta + δ for a problem that starts from another's weights). `BoundLoss` bridges the two
with `torch.func.functional_call` on one container module holding every module the loss
reads, so attribute access inside the user's code (`model.linear.weight`,
`module.parameters()`) also sees the substituted tensors. When every tuple passed is the
modules' own parameters (plain training steps), the user's function is called directly.
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
        self.own = [p if type(p) is tuple else tuple(p) for p in own]   # keep identities
        self.batch_of = batch_of
        self.offsets = dict(offsets or {})
        self.fn, self.modules = fn, tuple(modules)

    def _is_own(self, params: Sequence[Params]) -> bool:
        if self.offsets:
            return False
        for given, own in zip(params, self.own):
            if given is own:    # the problems' own tuples, as the training steps pass them
                continue
            if len(given) != len(own) or any(a is not b for a, b in zip(given, own)):
                return False
        return True

    def __call__(self, *params: Params) -> Tensor:
        extra = self.batch_of()
        if self._is_own(params):
            return self.fn(*self.modules, *extra)
        mapping: dict[str, Tensor] = {}
        for i, keys in enumerate(self.keys):
            values = params[i]
            if i in self.offsets:
                base = params[self.offsets[i]]
                values = tuple(b + d for b, d in zip(base, values))
            mapping.update(zip(keys, values))
        return torch.func.functional_call(self.container, mapping, extra, strict=False)


def select_parameters(module: nn.Module, trainable: Sequence[str], frozen: Sequence[str]) -> list[str]:
    """Names of `module`'s parameters matching a `trainable` glob and no `frozen` glob."""
    from fnmatch import fnmatchcase

    names = [n for n, _ in module.named_parameters()]
    keep = [n for n in names if any(fnmatchcase(n, g) for g in trainable)
            and not any(fnmatchcase(n, g) for g in frozen)]
    return keep
