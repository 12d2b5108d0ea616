"""Look at a program's real models and losses without spending memory: the `meta` device.

`probe_problem` builds a module on the meta device, draws one batch from the data (then
moves it to meta), evaluates the loss over the modules it names, and reports:

- which modules' parameters actually reach the loss: a walk of the loss's autograd graph
  to its leaves (a `.detach()`, a `torch.no_grad()` block or an integer-valued operation
  cuts a path, exactly as they cut gradients);
- the loss's shape and dtype (it must be a floating scalar);
- the bytes autograd saves for the backward pass (activations), counted with
  `torch.autograd.graph.saved_tensors_hooks`;
- the FX graph of the loss (`torch.fx.experimental.proxy_tensor.make_fx`, aten level),
  from which the operation count comes.

Errors raised by the user's code are returned, not raised, so the compiler can point at
the `.mlo` span that called it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class LossProbe:
    reached: frozenset[int]         # indices of the modules whose parameters reach the loss
    leaves: frozenset[int]          # ids of every parameter tensor that reaches it
    shape: tuple[int, ...]
    floating: bool
    activation_bytes: int
    fx_ops: int


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def to_meta(batch):
    if isinstance(batch, torch.Tensor):
        return batch.to("meta")
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_meta(b) for b in batch)
    if isinstance(batch, dict):
        return {k: to_meta(v) for k, v in batch.items()}
    return batch


def first_batch(data):
    return to_meta(next(iter(data)))


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _reached_leaves(loss: torch.Tensor) -> set[int]:
    seen, stack, leaves = set(), [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            leaves.add(id(var))
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return leaves


def probe_loss(fn: Callable, modules: Sequence[nn.Module], batch) -> LossProbe:
    """Evaluate `fn(*modules, batch)` on meta tensors (exceptions propagate to the caller)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(*modules, batch)
    if not isinstance(loss, torch.Tensor):
        return LossProbe(frozenset(), frozenset(), (), False, saved[0], 0)
    leaves = _reached_leaves(loss) if loss.grad_fn is not None else set()
    reached = frozenset(i for i, m in enumerate(modules) if any(id(p) in leaves for p in m.parameters()))
    return LossProbe(reached, frozenset(leaves), tuple(loss.shape), loss.is_floating_point(), saved[0],
                     _fx_ops(fn, modules, batch))


def _fx_ops(fn: Callable, modules: Sequence[nn.Module], batch) -> int:
    """Number of aten operations in the loss's FX graph (0 if it cannot be traced)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with torch.no_grad():
            gm = make_fx(lambda b: fn(*modules, b))(batch)
    except Exception:  # noqa: BLE001 - tracing is best effort; the probe above is the check
        return 0
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")
