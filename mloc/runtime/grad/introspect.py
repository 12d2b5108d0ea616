"""Look at a program's real models and losses without spending memory: the `meta` device.

`probe_problem` builds a module on the meta device, draws one batch from the data (then
moves it to meta), evaluates the loss over the modules it names, and reports:

- which modules' parameters actually reach the loss: a walk of the loss's autograd graph
  to its leaves (a `.detach()`, a `torch.no_grad()` block or an integer-valued operation
  cuts a path, exactly as they cut gradients);
- the loss's shape and dtype (it must be a floating scalar);
- the bytes the forward keeps for the backward pass (activations), the bytes the graph of
  the problem's own gradient keeps (``create_graph=True``: what a Hessian-vector product
  or an unrolled step holds) and the bytes of the batch, counted storage by storage as
  they are allocated (`mloc.runtime.base.memory.PeakMemory`, which works on meta tensors:
  nothing is computed). Parameters and the batch, which exist before the loss runs, are
  not activations;
- the FX graph of the loss (`torch.fx.experimental.proxy_tensor.make_fx`, aten level),
  from which the operation count comes.

Errors raised by the user's code are returned, not raised, so the compiler can point at
the `.mlo` span that called it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from mloc.runtime.base.tree import map_tensors


@dataclass(frozen=True)
class LossProbe:
    reached: frozenset[int]         # indices of the modules whose parameters reach the loss
    leaves: frozenset[int]          # ids of every parameter tensor that reaches it
    shape: tuple[int, ...]
    floating: bool
    activation_bytes: int           # fresh storages alive after the forward (kept for backward)
    fx_ops: int
    fx_code: str = ""               # the traced graph's Python code (aten level)
    returned: str = "Tensor"        # the type the loss returned, when not a tensor (`float`: `.item()`)
    graph_bytes: int | None = None  # ... after ∇ of the own parameters with create_graph, holding it
    hvp_bytes: int | None = None    # the peak during a Hessian-vector product through that graph
    backward_bytes: int | None = None   # the peak of the forward and a backward to every parameter reached
    batch_bytes: int = 0            # the batch's tensors
    compiled: dict = field(default_factory=dict)    # the same sizes as a compiled step holds them


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def to_meta(batch):
    return map_tensors(batch, lambda t: t.to("meta"))


def first_batch(data):
    return to_meta(next(iter(data)))


def floating_dtypes(tree) -> set:
    """The floating dtypes of the tensors in a batch or of a module's parameters."""
    if isinstance(tree, nn.Module):
        return {t.dtype for t in tree.parameters() if t.is_floating_point()}
    found: set = set()
    map_tensors(tree, lambda t: found.add(t.dtype) if t.is_floating_point() else None)
    return found


def without_grad(fn: Callable[[], object]) -> object:
    """``fn()`` under ``torch.no_grad()`` (how a `project` call runs)."""
    with torch.no_grad():
        return fn()


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def reached_leaves(loss: torch.Tensor) -> set[int]:
    """The ids of the leaf tensors (parameters, inputs that require grad) that ``loss``'s
    autograd graph reaches."""
    return walk_graph(loss.grad_fn)[0]


def walk_graph(grad_fn, ops: bool = False) -> tuple[set[int], tuple[str, ...]]:
    """The ids of the leaf tensors an autograd graph reaches from ``grad_fn`` and, with
    ``ops``, its differentiable operations in a fixed order (depth first, each node's inputs
    in order; autograd's node names, `MulBackward0` as `Mul`)."""
    seen, stack, leaves, names = set(), [grad_fn], set(), []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            leaves.add(id(var))
        elif ops:
            names.append(type(fn).__name__.removesuffix("0").removesuffix("Backward"))
        stack.extend(nxt for nxt, _ in reversed(fn.next_functions))
    return leaves, tuple(names)


def probe_loss(fn: Callable, modules: Sequence[nn.Module], batch, names: Sequence[str] = (),
               own: int | None = None, compiled: bool = True) -> LossProbe:
    """Evaluate `fn(*modules, batch)` on meta tensors (exceptions propagate to the caller);
    ``own``: the index of the problem's own module in ``modules``, whose gradient graph is
    measured (None: not measured); ``compiled``: also the sizes as a compiled step holds them."""
    from mloc.runtime.base.memory import PeakMemory

    batch_bytes = [0]
    map_tensors(batch, lambda t: batch_bytes.__setitem__(0, batch_bytes[0] + t.numel() * t.element_size()))
    with PeakMemory() as mem:
        loss = fn(*modules, batch)
    act = mem.live
    if not isinstance(loss, torch.Tensor):
        return LossProbe(frozenset(), frozenset(), (), False, act, 0, returned=type(loss).__name__,
                         batch_bytes=batch_bytes[0])
    leaves = reached_leaves(loss) if loss.grad_fn is not None else set()
    reached = frozenset(i for i, m in enumerate(modules) if any(id(p) in leaves for p in m.parameters()))
    backward = _backward_bytes(loss, [p for m in modules for p in m.parameters() if id(p) in leaves], mem)
    graph, hvp = _graph_bytes(fn, modules, batch, own) if own is not None and own in reached else (None, None)
    ops, code = _fx_trace(fn, modules, batch, names)
    compiled = _compiled(fn, modules, batch, leaves, own if own is not None and own in reached else None) \
        if compiled else {}
    return LossProbe(reached, frozenset(leaves), tuple(loss.shape), loss.is_floating_point(), act, ops, code,
                     graph_bytes=graph, hvp_bytes=hvp, batch_bytes=batch_bytes[0], backward_bytes=backward,
                     compiled=compiled)


def _compiled(fn: Callable, modules: Sequence[nn.Module], batch, leaves: set, own: int | None) -> dict:
    """The sizes as a compiled step holds them (`mloc.runtime.base.inductor_memory.compiled_sizes`)."""
    from mloc.runtime.base.inductor_memory import compiled_sizes

    params = [p for m in modules for p in m.parameters() if id(p) in leaves]
    if not params:
        return {}
    mine = [p for p in modules[own].parameters() if p.requires_grad] if own is not None else []
    others = [p for i, m in enumerate(modules) if i != own for p in m.parameters() if id(p) in leaves]
    return compiled_sizes(fn, modules, batch, params, mine, others if own is not None else ())


def _backward_bytes(loss: torch.Tensor, params: list, mem) -> int | None:
    """The peak bytes of the loss's forward (already measured by ``mem``) and its backward to
    ``params``: what one plain gradient of it holds at most (None: nothing to differentiate,
    or a backward without meta kernels)."""
    if not params or not loss.requires_grad or loss.shape != ():
        return None
    try:
        with mem:
            torch.autograd.grad(loss, params, allow_unused=True)
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return mem.peak


def _graph_bytes(fn: Callable, modules: Sequence[nn.Module], batch, own: int) -> tuple[int | None, int | None]:
    """Bytes alive once ``g = ∇_θ L`` is taken with its graph (``create_graph=True``) and held
    (the loss itself dropped, as a step drops it: the forward's tensors that ``g``'s graph
    needs stay); then the peak during one Hessian-vector product ``∇_θ⟨g, p⟩`` through it.
    (None, None) if the loss cannot be differentiated twice here (an operation without a
    meta kernel for its double backward)."""
    from mloc.runtime.base.memory import PeakMemory

    params = [p for p in modules[own].parameters() if p.requires_grad]
    if not params:
        return None, None
    try:
        with PeakMemory() as mem:
            g = torch.autograd.grad(fn(*modules, batch), params, create_graph=True, allow_unused=True)
            graph = mem.live
            outs = [t for t in g if t is not None and t.requires_grad]
            if outs:
                torch.autograd.grad(outs, params, [torch.ones_like(t) for t in outs], allow_unused=True)
        return graph, mem.peak
    except (RuntimeError, NotImplementedError, TypeError):
        return None, None


def _fx_trace(fn: Callable, modules: Sequence[nn.Module], batch, names: Sequence[str]) -> tuple[int, str]:
    """The loss's FX graph: its number of aten operations and its code ((0, "") if it cannot
    be traced, e.g. data-dependent control flow; the probe above is the check). The
    parameters the trace captured are renamed after the problems' own parameter names."""
    import re

    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with torch.no_grad():
            gm = make_fx(lambda b: fn(*modules, b))(batch)
    except Exception:  # noqa: BLE001
        return 0, ""
    owner = {id(t): f"{prob}.{n}" for prob, m in zip(names, modules) for n, t in m.named_parameters()}
    rename = {}
    for attr, value in [*gm.named_parameters(), *gm.named_buffers()]:
        if id(value) in owner:
            rename[attr] = owner[id(value)]
    code = gm.code.strip()
    code = re.sub(r"self\.(_param_constant\d+)", lambda m: rename.get(m.group(1), m.group(0)), code)
    code = re.sub(r"\b(_param_constant\d+)\b", lambda m: rename.get(m.group(1), m.group(0)).replace(".", "_"), code)
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"), code
