r"""Sharded modules (FSDP2, ``torch.distributed.fsdp.fully_shard``): plain steps and the
first-order hypergradients with every problem's parameters split across the ranks.

:func:`shard` wraps each child of a problem's module that holds parameters, then the module
itself, with ``fully_shard``: every parameter becomes a ``DTensor`` sharded on dim 0, each
rank keeps ``1/N`` of it (``torch.chunk``'s split; the last rank's shard may be shorter or
empty), FSDP all-gathers a child's parameters for its forward and again for its backward
(``reshard_after_forward``), and reduce-scatters, averaged over the ranks, the gradients a
``backward()`` produces into each parameter's sharded ``.grad``. mloc's functional
optimizers are applied to the local shards (:attr:`Sharded.local`, views of FSDP's own
storage), so the optimizer state is ``1/N`` as well.

**What was measured first** (torch 2.13, gloo, 2 CPU processes, float64; a 5-6-3 MLP):
``torch.autograd.grad`` *with respect to* the sharded parameters returns ``None`` (the
graph holds FSDP's unsharded copies, not the ``DTensor``\ s); ``loss.backward()`` gives
``.grad`` shards equal to the full-batch gradient (2.8e-17); ``autograd.grad`` with respect
to tensors *outside* a sharded module through its forward is exact (8.7e-19); an in-place
change of a local shard is seen by the next forward; ``requires_grad_(False)`` on sharded
parameters keeps a backward from reaching them. Second-order products fail: the gradient of
a sharded parameter is no function of it in the graph ("appears to not have been used").
Hence the rules here:

- every gradient is taken by ``backward()`` into ``.grad``, with ``requires_grad`` switched
  off for the parameters whose gradient is not wanted (:func:`gradients`);
- a point ``θ ± εq`` is reached by changing ``θ``'s shards in place and putting them back
  bit for bit afterwards (:func:`perturbed`), not by substituting tensors into the module
  (FSDP installs its own unsharded parameters at every forward);
- only methods without Hessian-vector products or unrolled differentiation apply: the
  registry's ``MethodCaps.shards`` (one home, with ``MethodCaps.unsharded_reason``); the
  planner refuses the others.

**The hypergradient** of an upper ``x`` over a lower ``θ`` (:func:`hypergradient`), with
``F`` the upper's loss and ``L`` the lower's, every gradient averaged over the ranks:

.. math::
    d_x = \nabla_x F - \frac{\nabla_x L(\theta + \epsilon q, x) - \nabla_x L(\theta - \epsilon q, x)}{2\epsilon},
    \quad q = v \ (\texttt{finite\_diff}) \text{ or } s \odot v \ (\texttt{sama}),\quad
    v = \nabla_\theta F,\quad \epsilon = \epsilon_0 / \lVert q \rVert

(``s`` the lower optimizer's ``diag``; ``first_order`` keeps ``∇_x F`` alone). The passes at
``θ ± εq`` run in full precision (autocast off), as one process's do. ``‖q‖`` is the
norm of the whole vector: the shards' squared sums, all-reduced. Liu et al., "DARTS", ICLR
2019, eq. 8; Choe et al., "Making Scalable Meta Learning Practical" (SAMA), NeurIPS 2023;
Zhao et al., "PyTorch FSDP", VLDB 2023.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

Loss = Callable[[], Tensor]


def shard(module: nn.Module, reshard_after_forward: bool = True) -> nn.Module:
    """``module`` sharded in place with ``fully_shard``: each child that holds parameters,
    then the root (which takes the parameters the children leave). Needs a process group."""
    from torch.distributed.fsdp import fully_shard
    for child in module.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, reshard_after_forward=reshard_after_forward)
    fully_shard(module, reshard_after_forward=reshard_after_forward)
    return module


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: a sharded ``DTensor``'s local shard (a view of FSDP's
    storage: writing it changes the parameter), any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def param_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s parameters this rank holds (its shards, when sharded)."""
    return sum(local(p).numel() * p.element_size() for p in module.parameters())


@dataclass(eq=False)
class Sharded:
    """One problem with its module sharded: ``optimizer`` (a functional
    :class:`~mloc.runtime.optim.Optimizer`) steps the local shards, ``state`` is its state
    over them. ``loss()`` evaluates the problem's loss on its current batch."""

    name: str
    module: nn.Module
    optimizer: Any
    loss: Loss
    params: tuple = field(init=False)
    state: Any = field(init=False, default=None)

    def __post_init__(self):
        self.params = tuple(self.module.parameters())
        self.state = self.optimizer.init(self.local)

    @property
    def local(self) -> tuple[Tensor, ...]:
        return tuple(local(p) for p in self.params)

    @torch.no_grad()
    def commit(self, grads: Sequence[Tensor]) -> None:
        """One optimizer step on the local shards from the local ``grads``."""
        self.state = self.optimizer.commit(tuple(grads), self.state, self.local)


@contextlib.contextmanager
def _only(wanted: Sequence[Sharded], everyone: Sequence[Sharded]) -> Iterator[None]:
    """``requires_grad`` on the parameters of ``wanted`` alone, as before afterwards."""
    keep = {id(p) for s in wanted for p in s.params}
    saved = [(p, p.requires_grad) for s in everyone for p in s.params]
    try:
        for p, _ in saved:
            p.requires_grad_(id(p) in keep)
        yield
    finally:
        for p, rg in saved:
            p.requires_grad_(rg)


def gradients(loss: Loss, of: Sequence[Sharded], everyone: Sequence[Sharded]) -> list[tuple[Tensor, ...]]:
    """``∇ loss()`` with respect to each problem of ``of``, as local shards averaged
    over the ranks: one ``backward()`` (FSDP reduce-scatters; a parameter that is not a
    ``DTensor`` is all-reduced here), with the other problems' parameters held constant.
    Zeros where the loss does not reach. ``.grad`` is left cleared."""
    params = [p for s in of for p in s.params]
    for p in params:
        p.grad = None
    with _only(of, everyone):
        value = loss()
        if value.requires_grad:
            value.backward()
    out = []
    for s in of:
        out.append(tuple(_taken(p) for p in s.params))
    return out


def _taken(p: Tensor) -> Tensor:
    """``p.grad``'s local shard, averaged over the ranks (zeros when none), ``.grad`` cleared."""
    g = p.grad
    p.grad = None
    if g is None:
        return torch.zeros_like(local(p))
    if isinstance(g, DTensor):
        return g.to_local()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(g)
        g = g / dist.get_world_size()
    return g


def plain_step(problem: Sharded, everyone: Sequence[Sharded]) -> Tensor:
    """A lower problem's step: ``∇_θ L`` averaged (:func:`gradients`), then its optimizer on
    the shards. Returns the loss this rank saw, detached."""
    seen = []

    def loss():
        seen.append(problem.loss())
        return seen[-1]
    (g,) = gradients(loss, [problem], everyone)
    problem.commit(g)
    return seen[0].detach()


@contextlib.contextmanager
def perturbed(problem: Sharded, direction: Sequence[Tensor], e: Tensor) -> Iterator[None]:
    """``θ + e·q`` in the local shards of ``problem`` for the block (``direction`` = local
    shards of ``q``); afterwards ``θ`` exactly as before (copied back, not subtracted) and the
    module's buffers (BatchNorm statistics) as before."""
    shards = problem.local
    saved = [t.clone() for t in shards]
    buffers = [(b, b.clone()) for b in problem.module.buffers()]
    try:
        with torch.no_grad():
            for t, q in zip(shards, direction):
                t.add_(q * e)
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(shards, saved):
                t.copy_(s)
            for b, s in buffers:
                b.copy_(s)


def global_norm(tensors: Sequence[Tensor]) -> Tensor:
    """``‖q‖`` of the whole vector whose shards are ``tensors`` (one all-reduce of the sum of
    squares)."""
    total = sum((t.double().pow(2).sum() for t in tensors), torch.zeros((), dtype=torch.float64))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return total.sqrt().to(tensors[0].dtype) if tensors else total


def hypergradient(method: Any, caps: Any, upper: Sharded, lower: Sharded,
                  everyone: Sequence[Sharded]) -> tuple[Tensor, ...]:
    """The upper's hypergradient (module docstring) as local shards of ``upper``, for a
    method whose registry capabilities ``caps`` (``MethodCaps``) say it ``shards``:
    ``no_indirect`` keeps ``∇_x F``; a lower optimizer ``diag`` in ``caps.needs``
    (``sama_diag``) preconditions ``q``; ``finite_diff``'s ``xi`` scales it (``q = ξ v``);
    ``method.eps`` is ``ε₀``. The two passes at ``θ ± εq`` run in full precision, autocast
    off (as :func:`mloc.runtime.methods.finite.central_difference`: their round-off is
    divided by ``2ε``), on ``lower.exact_loss`` where the problem has one (its loss without
    the autocast region its ``loss`` enters), else on ``lower.loss``."""
    if not caps.shards:
        raise ValueError(f"{type(method).__name__} cannot run on sharded modules: {caps.unsharded_reason}")
    if caps.no_indirect:
        return gradients(upper.loss, [upper], everyone)[0]
    direct, v = gradients(upper.loss, [upper, lower], everyone)
    q = _preconditioned(lower, v, everyone) if "sama_diag" in caps.needs else v
    xi = getattr(method, "xi", 1)
    if xi != 1:
        q = tuple(xi * t for t in q)
    norm = global_norm(q)
    e = method.eps / norm.clamp_min(torch.finfo(norm.dtype).tiny)
    exact = getattr(lower, "exact_loss", lower.loss)
    with perturbed(lower, q, e), _autocast_off(q):
        (plus,) = gradients(exact, [upper], everyone)
    with perturbed(lower, q, -e), _autocast_off(q):
        (minus,) = gradients(exact, [upper], everyone)
    two_e = 2 * e
    return tuple(d + (gp - gm) / -two_e for d, gp, gm in zip(direct, plus, minus))


def _autocast_off(q: Sequence[Tensor]) -> contextlib.AbstractContextManager:
    """Autocast switched off for ``q``'s device where a region has it on (else nothing)."""
    device = q[0].device.type if q else "cpu"
    return torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else contextlib.nullcontext()


def _preconditioned(lower: Sharded, v: Sequence[Tensor], everyone: Sequence[Sharded]) -> tuple[Tensor, ...]:
    """``s ⊙ v`` with ``s`` the lower optimizer's ``diag`` on the shards (elementwise, so each
    rank computes its own part), at the averaged lower gradient when the diagonal reads it."""
    opt = lower.optimizer
    if not getattr(opt, "has_diag", False):
        raise ValueError(f"sama needs the diagonal of {lower.name!r}'s optimizer; this optimizer has none")
    grads = gradients(lower.loss, [lower], everyone)[0] if opt.diag_uses_grad else None
    with torch.no_grad():
        return tuple(s * x for s, x in zip(opt.diag(grads, lower.state, lower.local), v))


@torch.no_grad()
def gathered(problem: Sharded) -> dict[str, Any]:
    """``problem``'s parameters and optimizer state as whole tensors on every rank (for a
    checkpoint that any world size, sharded or not, can read): each shard all-gathered."""
    params = [p.full_tensor() if isinstance(p, DTensor) else p.detach().clone() for p in problem.params]
    return {"params": params, "state": gathered_state(problem)}


@torch.no_grad()
def gathered_state(problem: Sharded) -> Any:
    """:func:`gathered`'s optimizer state alone (the parameters are not gathered)."""
    return _map_state(problem, whole)


@torch.no_grad()
def load_gathered(problem: Sharded, saved: dict[str, Any]) -> None:
    """Put :func:`gathered`'s whole tensors back: this rank's shard of each."""
    for p, full in zip(problem.params, saved["params"]):
        local(p).copy_(part(p, full))
    problem.state = _map_state(problem, lambda p, t: part(p, t), saved["state"])


def whole(p: Tensor, shard_: Tensor) -> Tensor:
    """The whole tensor whose local shard, laid out as the parameter ``p``, is ``shard_``
    (every rank calls: an all-gather; a copy of ``shard_`` when ``p`` is not sharded)."""
    if not isinstance(p, DTensor):
        return shard_.clone()
    return DTensor.from_local(shard_, p.device_mesh, p.placements, shape=p.shape,
                              stride=p.stride()).full_tensor()


def part(p: Tensor, full: Tensor) -> Tensor:
    """This rank's shard of the whole tensor ``full`` laid out as the parameter ``p`` (a copy
    of ``full`` when ``p`` is not sharded)."""
    if not isinstance(p, DTensor):
        return full.clone()
    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local().clone()


def _map_state(problem: Sharded, f: Callable[[Tensor, Tensor], Tensor], state: Any = None) -> Any:
    """The optimizer state with ``f(param, tensor)`` applied to every per-parameter tensor:
    a field of the state (a ``NamedTuple``) that is a tuple with one tensor per parameter.
    Other fields (step counts) are kept as they are."""
    state = problem.state if state is None else state
    n, values = len(problem.params), []
    for v in state:
        if isinstance(v, tuple) and len(v) == n and n and all(isinstance(t, Tensor) for t in v):
            v = tuple(f(p, t) for p, t in zip(problem.params, v))
        values.append(v)
    return type(state)(*values)
