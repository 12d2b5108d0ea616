"""The chain step: interlocking backpropagation as the engine's third gradient source.

Gomez, Key et al., "Interlocking Backpropagation: Improving depthwise model-parallelism",
JMLR 23(171), 2022. Who trains whom is :class:`mloc.shared.interlock.Interlock`; this module
computes it, one stage at a time, so that the same primitives run in one process (the
simulation, :class:`ChainStep`) and in one process per stage (:mod:`mloc.runtime.processes.pipeline`).

**The contract with the user's code.** Stage k's loss ``loss_k(stage_1, ..., stage_k, batch)``
is ordinary Python: it runs the stages one after the other, each called once on what the
previous one returned (anything the loss does in between is allowed), and scores stage k's
output with a head (parameters of stage k's module that its ``forward`` does not use, such
as a ``head`` submodule, or none). A stage's ``forward`` takes and returns one tensor.
Nothing else is asked: the runtime cuts the losses at the stage boundaries itself, through
the module calls:

- :func:`forward_stage` evaluates ``loss_t`` with every earlier stage's ``forward``
  replaced by one that returns stage t-1's features as a leaf tensor (so only stage t
  computes, and the gradient at its input can be read off the leaf), and with a forward
  hook on stage t that keeps its output ``out_t`` and hands the head a detached copy
  ``z_t``: the head trains on detached features. A head that is not needed stops the loss
  right there (no head cost). Every stage call and the head's loss are checked against
  the contract (:mod:`mloc.runtime.grad.chain_contract`): a loss that calls a stage twice, out of
  order or not at all, feeds an earlier stage's output or parameters past the cut, is
  :class:`ChainContractError`, never another function computed silently. The trace pass
  runs the same check at compile time (:func:`check_contract`, on the meta device);
- :func:`head_backward` differentiates ``l_t`` with respect to stage t's parameters (only
  the head's are reached: the features are detached) and ``z_t`` (the gradient signal);
- :func:`stage_backward` sends a signal ``g = dl_t/d out_j`` through stage j: the signal
  at its input first (B_in, :func:`input_backward`, when l_t must reach a stage below j),
  then its parameters' gradient (B, :func:`param_backward`, when l_t trains stage j).

One step (:meth:`ChainStep.gradients`): the forward wave (each stage once), then every
evaluated head's loss and its signal down to the deepest stage it trains, then one commit
per stage through that stage's own pipeline (its own optimizer), all from gradients taken
at the parameters of the step before. Stage k's gradient is the sum of its main
parameters' (from ``l_target(k)``) and its head's (from ``l_k``): disjoint parameters, so
the sum is exact.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mloc.shared.interlock import Interlock
from mloc.runtime.grad.chain_contract import ChainContractError, Cut, contract, differs
from mloc.runtime.base import tree
from mloc.runtime.base.tree import Params


class _Stop(BaseException):
    """Raised from stage t's forward hook when its head is not needed (a BaseException,
    so that no ``except Exception`` in the user's loss swallows it)."""


@dataclass
class StageForward:
    """What :func:`forward_stage` leaves for the backward: stage t's input leaf (None for
    the first stage), its output (with its graph), the detached copy its head read, and
    the head's loss (None when it was not evaluated)."""

    leaf: Tensor | None
    out: Tensor
    z: Tensor | None
    loss: Tensor | None
    between: dict[int, tuple[str, ...]] = field(default_factory=dict)   # (`Cut.between`)


@contextmanager
def _installed(modules: Sequence[nn.Module], t: int, stand_in: Callable, pre_hook: Callable, hook: Callable):
    """Stages 0..t-1 replaced by ``stand_in(j)`` and stage t's hooks registered, for the
    block's length; the modules' own ``forward`` (an instance attribute or none) restored."""
    own = [m.__dict__.get("forward") for m in modules[:t]]
    for j, m in enumerate(modules[:t]):
        m.forward = stand_in(j)
    handles = (modules[t].register_forward_pre_hook(pre_hook), modules[t].register_forward_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for m, f in zip(modules[:t], own):
            if f is None:
                del m.forward
            else:
                m.forward = f


def forward_stage(loss: Callable[[], Tensor], modules: Sequence[nn.Module], t: int,
                  features: Tensor | None, head: bool, names: Sequence[str]) -> StageForward:
    """Stage ``t``'s forward inside its own loss ``loss()`` (a closure over the modules
    and the batch), the earlier stages replaced by stand-ins that return ``features``
    (stage t-1's output; stage t-1's is the leaf whose gradient is read, each earlier one
    its own copy, a marker), and, when ``head``, its head's loss on the detached output.
    Every call of stages 0..t is checked against the chain contract
    (:mod:`mloc.runtime.grad.chain_contract`): a breach is :class:`ChainContractError`."""
    leaf = None if t == 0 else features.detach().requires_grad_()
    kept: dict[str, Any] = {}
    cut = Cut(modules, t, names)

    def stand_in(j):
        def forward(*args, **kwargs):
            cut.called(j, (*args, *kwargs.values()))
            return cut.mark(j, leaf if j == t - 1 else features.detach().requires_grad_())
        return forward

    def pre_hook(module, args):
        cut.called(t, args)

    def hook(module, args, out):
        if "out" in kept:         # a second call: reported once the loss has run (Cut.error)
            return kept.get("z", out)
        if not isinstance(out, Tensor):
            raise ChainContractError(f"stage `{names[t]}` returned {type(out).__name__}, not a tensor",
                                     "a stage's forward takes and returns one tensor (its features)")
        kept["out"] = out
        if not head:
            raise _Stop
        kept["z"] = out.detach().requires_grad_()
        return kept["z"]

    value = None
    with _installed(modules, t, stand_in, pre_hook, hook):
        try:
            value = loss()
        except _Stop:
            pass
        except Exception as err:
            broken = cut.error(complete=False)
            if broken is not None:
                raise broken from err
            raise
    if head:
        cut.scored(value)
    broken = cut.error(complete=True)
    if broken is not None:
        raise broken
    if "out" not in kept:       # (Cut.error reports a loss that never calls stage t: a guard)
        raise ChainContractError(f"the loss of `{names[t]}` never calls stage `{names[t]}`", contract(names, t))
    return StageForward(leaf, kept["out"], kept.get("z"), value if head else None, cut.between)


def check_contract(losses: Sequence[Callable[[], Tensor]], modules: Sequence[nn.Module],
                   names: Sequence[str]) -> tuple[int, Exception] | None:
    """The forward wave of a chain with every head evaluated, as a step runs it (what the
    trace pass runs on the meta device): None, or the first stage whose loss raised and
    what it raised (:class:`ChainContractError` for a breach of the contract, including
    a loss that computes an earlier stage's input otherwise than that stage's loss does:
    :func:`same_between`)."""
    fws: list[StageForward] = []
    for t, loss in enumerate(losses):
        try:
            fws.append(forward_stage(loss, modules, t, fws[-1].out if fws else None, True, names))
            same_between(fws, names)
        except Exception as err:  # noqa: BLE001 - the user's code, or the contract
            return t, err
    return None


def same_between(fws: Sequence[StageForward], names: Sequence[str]) -> None:
    """The last loss of ``fws`` computes the input of each earlier stage j from stage
    j-1's output as the loss of stage j does (the same operations: the chain takes stage
    j's features from that loss), or :class:`ChainContractError`."""
    t, here = len(fws) - 1, fws[-1].between
    for j in range(1, t):
        if here.get(j) != fws[j].between.get(j):
            raise ChainContractError(f"the loss of `{names[t]}` " + differs(names, j, here.get(j, ()),
                                                                           fws[j].between.get(j, ())),
                                     contract(names, t))


def head_backward(fw: StageForward, params: Params, signal: bool) -> tuple[list, Tensor | None]:
    """``dl_t/d params`` (the head's part; the main parameters get None: the head read
    detached features) and, when ``signal``, ``dl_t/d out_t``."""
    inputs = tuple(params) + ((fw.z,) if signal else ())
    grads = torch.autograd.grad(fw.loss, inputs, allow_unused=True)
    return list(grads[:len(params)]), (grads[-1] if signal else None)


def stage_backward(fw: StageForward, params: Params, g: Tensor, train: bool,
                   send: bool) -> tuple[list | None, Tensor | None]:
    """The signal ``g = dl/d out_j`` through stage j: first the signal at its input when
    ``send`` (B_in: what the stage below waits for, so a pipeline sends it before going
    on), then its parameters' gradient when ``train`` (B). Two backward calls over the
    kept graph, in that order, in both executions."""
    g_in = input_backward(fw, g) if send else None
    return (param_backward(fw, params, g) if train else None), g_in


def input_backward(fw: StageForward, g: Tensor) -> Tensor:
    """B_in alone: ``dl/d in_j`` from ``g = dl/d out_j``."""
    return torch.autograd.grad(fw.out, (fw.leaf,), g, retain_graph=True)[0]


def param_backward(fw: StageForward, params: Params, g: Tensor) -> list:
    """B alone: ``dl/d params_j`` from ``g = dl/d out_j``."""
    return list(torch.autograd.grad(fw.out, tuple(params), g, retain_graph=True, allow_unused=True))


def add_into(acc: list, grads: Sequence[Tensor | None]) -> None:
    """``acc += grads`` elementwise, None meaning zero (kept None while both are)."""
    for i, g in enumerate(grads):
        if g is not None:
            acc[i] = g if acc[i] is None else acc[i] + g


@dataclass(frozen=True)
class StageRuntime:
    """One stage as a chain step sees it: its name, module, trainable parameters, its loss
    at its own parameters (a closure over the modules and the current batch) and its
    precision context."""

    name: str
    module: nn.Module
    params: Params
    loss: Callable[[], Tensor]
    autocast: Callable[[], Any]


class ChainStep:
    """Interlocking backpropagation over ``stages`` in one process: the simulation."""

    def __init__(self, chain: Interlock, stages: Sequence[StageRuntime]):
        self.chain, self.stages = chain, tuple(stages)
        self.modules = [s.module for s in stages]
        self.names = [s.name for s in stages]

    def forward(self) -> list[StageForward]:
        """The forward wave: each stage once, its head where it is evaluated."""
        out, features = [], None
        heads = set(self.chain.evaluated())
        for t, s in enumerate(self.stages):
            with s.autocast():
                fw = forward_stage(s.loss, self.modules, t, features, t in heads, self.names)
            out.append(fw)
            same_between(out, self.names)
            features = fw.out
        return out

    def gradients(self) -> list[tuple[Params, Tensor | None]]:
        """Each stage's (dense gradients, detached own loss or None), all taken at the
        current parameters."""
        fws = self.forward()
        chain = self.chain
        grads: list[list] = [[None] * len(s.params) for s in self.stages]
        for t in chain.evaluated():
            trains = chain.trained_by(t)
            head, g = head_backward(fws[t], self.stages[t].params, bool(trains))
            add_into(grads[t], head)
            for j in range(t, chain.reach(t) - 1, -1) if trains else ():
                own, g = stage_backward(fws[j], self.stages[j].params, g, j in trains, j > chain.reach(t))
                if own is not None:
                    add_into(grads[j], own)
        return [(tree.dense(tuple(gr), s.params), fw.loss.detach() if fw.loss is not None else None)
                for gr, s, fw in zip(grads, self.stages, fws)]


def stages_of(chain: Interlock, live: dict) -> list[StageRuntime]:
    """The chain's stages from the engine's runtime problems (:class:`mloc.runtime.program.build.Live`)."""
    return [StageRuntime(n, live[n].module, live[n].problem.params, live[n].problem.loss.own, live[n].autocast)
            for n in chain.stages]


def chain_stepper(chain: Interlock, live: dict, draw_first: Callable[[], None],
                  pipeline_of: Callable, compiled: Callable | None = None) -> Callable[[], None]:
    """The engine's chain step (:meth:`mloc.runtime.program.engine.Program.chain_step`): draw the
    first stage's next batch, give it to every stage (the chain's stages read one batch:
    their `data` is one call, E507), take the chain's gradients, commit each stage's through
    its own pipeline (``pipeline_of(stage)``: its own optimizer, clipping, NaN watch,
    all-reduce), in depth order. ``compiled(gradients)``: the gradients compiled as one
    graph where the run compiles (:meth:`mloc.runtime.program.compiling.Compiling.chain`)."""
    lives = [live[n] for n in chain.stages]
    step = ChainStep(chain, stages_of(chain, live))
    gradients = compiled(lambda seed=None: step.gradients()) if compiled is not None else lambda: step.gradients()
    pipelines = [pipeline_of(n) for n in chain.stages]
    scaled = [lv.spec.name for lv, p in zip(lives, pipelines) if p.seed is not None]
    if scaled:
        raise ChainContractError(f"stage `{scaled[0]}` trains in fp16 with loss scaling, which chain steps "
                                 "do not apply", "train the chain in bf16 or fp32 (`precision = bf16`)")
    first, rest = lives[0], lives[1:]

    def run() -> None:
        draw_first()
        for lv in rest:
            lv.batch = first.batch
        for pipeline, (grads, loss) in zip(pipelines, gradients()):
            pipeline.run(grads, loss)
    return run
