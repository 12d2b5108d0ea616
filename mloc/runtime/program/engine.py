"""The training engine a compiled program's `train.py` drives.

Generated code declares the program (`ProblemSpec`s, hierarchy `Edge`s, the semantics the
planner chose) and its schedule (`outer_step`, a few plain lines calling `lower_step`,
`upper_step`, `draw`, `reset`). :class:`Program` is that vocabulary; the work is done by

- :mod:`mloc.runtime.program.build`: seed, modules (in source order), trainable parameters, data
  streams, runtime `Problem`s whose losses are `BoundLoss`es, the `Hierarchy`;
- :mod:`mloc.runtime.grad.sources`: where a step's gradients come from (a lower problem's
  plain gradient, an upper problem's hypergradient); :mod:`mloc.runtime.grad.interlock`: the
  third source, an interlocking chain's step (:meth:`Program.chain_step`); a vectorized
  meta-batch, :mod:`mloc.runtime.grad.metabatch`. Each step kind is an object built at its first
  use and owned here; what they are built from is public (:meth:`Program.drawer`,
  :meth:`Program.pipeline`), so no step kind reaches into the program;
- :mod:`mloc.runtime.grad.commit`: one commit pipeline per problem that every source feeds
  (all-reduce, unscale, clip, NaN/Inf watch on the device, optimizer commit);
- :mod:`mloc.runtime.program.state`: snapshot and restore (parameters, optimizer states, module
  buffers, data positions, RNGs, step counters), so a resumed run is bitwise identical to
  an uninterrupted one on CPU.

Step semantics (what a hand-written loop must do to match): each step of a problem draws
the next batch from its own data stream; an upper problem's hypergradient is taken at the
lower problems' current parameters with their most recent batches; `itd` unrolls from the
lower's current point on its current batch.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import torch
from torch import nn

from mloc.runtime.program import fsdp_run, state as _state
from mloc.runtime.base import tree
from mloc.runtime.grad.accumulate import Accumulator
from mloc.runtime.grad.buffers import buffers_of, frozen, guard_step, inference
from mloc.runtime.program.build import Live, ProblemSpec, build, resolve_device
from mloc.runtime.grad.commit import Pipeline, build_pipeline
from mloc.runtime.grad.compose import Edge
from mloc.runtime.program.data import cast_data, cast_floating
from mloc.runtime.base.distributed import DistContext, launched_slot
from mloc.runtime.program.evaluations import metrics
from mloc.runtime.grad.interlock import Interlock, chain_stepper
from mloc.runtime.grad.metabatch import MetaBatch
from mloc.runtime.files.options import RunConfig
from mloc.runtime.grad.finite import FiniteGuard, verify_state
from mloc.runtime.grad.sources import Source, hypergradient, plain_gradient
from mloc.runtime.program.compiling import Compiling

__all__ = ["Program", "ProblemSpec", "RunConfig", "resolve_device"]


class Program:
    """A compiled program, instantiated: call `outer_step()` to train one top-level step."""

    def __init__(self, *, name: str, specs: Sequence[ProblemSpec], edges: Sequence[Edge],
                 semantics: str, build_modules: Callable[[], dict], data: dict[str, Callable],
                 schedule: Callable[["Program"], None], config: RunConfig,
                 evaluations: Sequence = (), compositions: dict | None = None,
                 chains: Sequence[Interlock] = ()):
        self.name, self.config, self._schedule = name, config, schedule
        self.chains = {c.stages[0]: c for c in chains}     # by first stage (`chain_step`)
        self.device = resolve_device(config.device, *launched_slot())   # then its backend
        self.dist = DistContext.from_env(device=self.device)
        self.step_count = 0
        self.evaluations = tuple(evaluations)
        self.guard = FiniteGuard()
        fsdp_run.refuse(config, specs, edges, chains, schedule)    # what fsdp cannot run: exit 2
        built = build(specs, edges, semantics, build_modules, data, config, self.dist, self.device, compositions)
        self.modules, self.streams, self.live = built.modules, built.streams, built.live
        self.hierarchy, self._cast, self.sync, self.strategy = built.hierarchy, built.cast, built.sync, built.strategy
        self._steps: dict[tuple[str, str], Any] = {}    # the step kinds' objects (:meth:`_step`)
        self._starts = {n: _start_of(lv) for n, lv in self.live.items() if lv.spec.reinit is not False}
        for lv in self.live.values():
            lv.problem.optimizer.start()
        self.fsdp = fsdp_run.Steps(self.live, edges) if self.strategy[0] == "fsdp" else None
        self.compiling = Compiling(self, "off" if self.fsdp else config.compile, self._steps)   # `--compile`: how each step runs

    # --- the schedule's vocabulary ------------------------------------------------------
    def draw(self, name: str) -> None:
        """Draw the next batch of `name` (its loss uses it until the next draw)."""
        batch = self.streams[name].next()
        self.live[name].batch = batch if self._cast is None else cast_floating(batch, self._cast)

    def lower_step(self, name: str, draw: bool = True) -> None:
        """One gradient step of `name` on its own loss (the lowest problems)."""
        self._step("lower", name, self._stepper)(draw)

    def upper_step(self, name: str) -> None:
        """Hypergradient of `name` through every problem below it, then its optimizer step."""
        self._step("upper", name, self._stepper)()

    def accumulate(self, name: str) -> None:
        """One micro-step of `name` (`accumulate = k`): draw, add its gradient up."""
        self._step("accumulate", name, self._accumulator).add()

    def apply(self, name: str) -> None:
        """`name`'s optimizer step on the mean of its accumulated micro-steps."""
        self._step("accumulate", name, self._accumulator).apply()

    def meta_batch(self, name: str, tasks: int, steps: int) -> None:
        """One step of `name` on the mean hypergradient of `tasks` solves of its lower
        problem (`steps` steps each, from its reset), vectorized with ``torch.func.vmap``
        (`vmap = true`; :mod:`mloc.runtime.grad.metabatch`)."""
        self._step("meta_batch", name, lambda n: MetaBatch(
            self, n, tasks, steps, lambda solve, args: self.compiling.meta_batch(n, solve, args)))()

    def chain_step(self, first: str) -> None:
        """One interlocking step of the chain that starts at stage `first`
        (:func:`mloc.runtime.grad.interlock.chain_stepper`: every stage, each committed through
        its own pipeline)."""
        self._step("chain", first, lambda n: chain_stepper(self.chains[n], self.live, self.drawer(n), self.pipeline,
                                                           lambda g: self.compiling.chain(n, g)))()

    def _step(self, kind: str, name: str, make: Callable[[str], Any]) -> Any:
        """The step of kind `kind` of problem `name`, ``make(name)`` at its first use and
        kept: one object per step kind and problem, owned here."""
        self.sync.owner, step = name, self._steps.get((kind, name))    # owner: whose collectives run now
        if step is None:
            step = self._steps[kind, name] = make(name)
        return step

    def _stepper(self, name: str) -> Callable[..., None]:
        return _stepper(self.drawer(name), self._source(name, pipeline=self.pipeline(name)), self.pipeline(name))

    def _accumulator(self, name: str) -> Accumulator:
        return Accumulator(self.drawer(name), self._source(name, micro=True), self.pipeline(name))

    def _source(self, name: str, micro: bool = False, pipeline: Pipeline | None = None) -> Source:
        """Where `name`'s steps take their gradients: its plain gradient (a lowest problem) or its hypergradient,
        with the buffer rule (`mloc.runtime.grad.buffers`), compiled where the run compiles (with the update where
        ``pipeline`` allows: :mod:`mloc.runtime.program.compiling`), averaged as it runs (``OverlappedSync.final``)."""
        if self.fsdp is not None:        # strategy fsdp: mloc.runtime.program.fsdp_run
            return self.fsdp.source(name)
        lv, final, wrap = self.live[name], self.sync.final(micro), partial(self.compiling.source, pipeline=pipeline)
        if not self.hierarchy.lowers.get(name):
            reads = lv.spec.reads
            loss = lv.problem.loss.step_loss(reads.index(name) if name in reads else None)
            others = buffers_of((self.live[r].module for r in reads if r != name), exclude=tuple(lv.module.buffers()))
            return wrap("lower", name, guard_step(plain_gradient(lv.problem.params, loss, lv.autocast, final), others))
        source = hypergradient(self.hierarchy.hypergrad, name, lv.problem.params, lv.autocast,
                               into_grad=self.pipeline(name).on_grad and final is None, sync=final)
        own = buffers_of((lv.module,))
        return wrap("upper", name, guard_step(source, buffers_of(self.modules.values(), exclude=own), own,
                                              lv.problem.loss))

    def reset(self, name: str) -> None:
        """Start `name` again, with a fresh optimizer state: from its `init` problem's
        parameters (δ = 0), or (`reinit`) from its initial parameters or its reinit call."""
        _state.restart(self.live[name].problem, self._starts.get(name))

    def outer_step(self) -> None:
        self._schedule(self)
        self.step_count += 1

    # --- what step kinds are built from (the chain step, the meta-batch, a pipeline worker) ---
    def drawer(self, name: str) -> Callable[[], None]:
        """:meth:`draw` for one problem, bound once."""
        if self._cast is not None:
            return lambda: self.draw(name)
        lv, next_batch = self.live[name], self.streams[name].next

        def draw() -> None:
            lv.batch = next_batch()
        return draw

    def pipeline(self, name: str) -> Pipeline:
        """`name`'s commit pipeline (:mod:`mloc.runtime.grad.commit`), built at its first step (a
        precision setting changed before it is taken into account)."""
        lv = self.live[name]
        if lv.pipeline is None:
            lv.pipeline = build_pipeline(lv, self.fsdp.sync if self.fsdp else self.sync, self.guard, self, upper=bool(self.hierarchy.lowers.get(name)))
        return lv.pipeline

    # --- reading ------------------------------------------------------------------------
    def module(self, name: str) -> nn.Module:
        """`name`'s module with its current parameters (θ_init + δ for `init` problems)."""
        lv = self.live[name]
        if lv.spec.init is None:
            return lv.module
        base = self.live[lv.spec.init]
        with torch.no_grad():
            named = dict(lv.module.named_parameters())
            for s, b, d in zip(lv.slots, base.problem.params, lv.problem.params):
                named[s].copy_(b + d)
        return lv.module

    def data(self, value):
        """An evaluation's data argument where the batches are (:func:`_as_batches`)."""
        return _as_batches(value, self._cast, self.device)

    def losses(self) -> dict[str, float]:
        """Each problem's loss on its current batch (for logging), with the modules in
        evaluation mode, no autograd, no buffer changed (:func:`~mloc.runtime.grad.buffers.inference`)."""
        with inference(self.modules.values()):
            return self.fsdp.losses() if self.fsdp is not None else _losses(self.live)

    def hypergradients(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each upper problem's hypergradient at the current state, without stepping."""
        return {name: _hypergradient(self, name) for name in self.live if self.hierarchy.lowers.get(name)}

    def evaluate(self, labels: Sequence[str] | None = None) -> dict[str, float]:
        """The program's evaluations (all, or those named in ``labels``) as metrics: a
        number or 0-dim tensor under its label, a dict's entries under their keys
        (:func:`~mloc.runtime.program.evaluations.metrics`; anything else is an EvaluationError).

        Every module in evaluation mode (dropout off, BatchNorm on its running statistics)
        and its previous mode restored after; no autograd (an evaluation that needs
        gradients enters ``torch.enable_grad()`` itself); no buffer changed. ``mloc run``
        and the Python API both evaluate through here."""
        out: dict[str, float] = {}
        with inference(self.modules.values()):
            for e in self.evaluations:
                if labels is None or e.name in labels:
                    out.update(metrics(e.name, e.function, e.function(self), e.named))
        return out

    # --- state --------------------------------------------------------------------------
    def state_dict(self, sharded: bool = False) -> dict:
        """The training state (:func:`mloc.runtime.program.state.snapshot`), what every checkpoint
        holds (``checkpoint.pt``, ``best.pt``, ``Session.save``). Raises
        :class:`~mloc.runtime.grad.finite.NonFiniteError` instead of returning a state with a
        NaN or Inf: first the steps' watches are read (a failed step is named, with its
        step), then the whole state is verified, parameters and every floating tensor of
        the optimizer states (Shampoo's pending roots included, after the drain), in one
        read. So no checkpoint ever holds a non-finite parameter or optimizer state,
        whatever wrote it. Module buffers are not verified (a buffer may hold ``-inf`` on
        purpose). ``sharded``: `zero` optimizer states as this rank's shard (``snapshot``)."""
        drain(self)                          # background optimizer work lands in the state
        self.guard.check()
        verify_state(self.step_count, {n: lv.problem.params + tree.tensors(lv.problem.state)
                                       for n, lv in self.live.items()})
        return _state.snapshot(self.name, self.step_count, self.live, self.streams, sharded)

    def load_state_dict(self, state: dict) -> None:
        for lv in self.live.values():
            lv.problem.optimizer.drain()
        self.step_count = _state.restore(state, self.live, self.streams)

    def close(self) -> None:
        """End of the run, normally or not: optimizers stop their background work. The
        process group (data parallelism) stays for the process's next program and is left
        at exit (:mod:`mloc.runtime.base.distributed`)."""
        for lv in self.live.values():
            lv.problem.optimizer.close()


def drain(program: Program) -> None:
    """Every optimizer's background work lands in its state. Under data parallelism every
    rank calls it before the main one takes :meth:`Program.state_dict` (Shampoo's
    asynchronous roots are exchanged across the ranks then, :mod:`mloc.runtime.optim.rootwork`)."""
    for lv in program.live.values():
        lv.problem.optimizer.drain()


def param_bytes(program: Program) -> int:
    """The bytes of parameters this process holds: every module's, or its shards of them
    under `strategy = fsdp` (``config.json``'s ``param_bytes``, rank 0's)."""
    return fsdp_run.param_bytes(list(program.modules.values()))


def _losses(live) -> dict[str, float]:
    """:meth:`Program.losses` of whole modules (under :func:`inference`)."""
    out = {}
    for name, lv in live.items():
        if lv.batch is None:
            continue
        args = [live[r].problem.params for r in lv.problem.reads]
        with lv.autocast():
            out[name] = float(lv.problem.loss(*args))
    return out


def _hypergradient(program: Program, name: str) -> dict[str, torch.Tensor]:
    """Upper problem ``name``'s hypergradient by slot, at the program's current state (its
    batches and those of the problems below drawn where none is), the buffers frozen and
    the parameters' ``.grad`` as they were before; in full precision (the problems'
    autocast is not entered). Under `strategy = fsdp` every rank calls it and gets the
    whole tensors (:meth:`mloc.runtime.program.fsdp_run.Steps.hypergradient`)."""
    lv = program.live[name]
    for below in program.hierarchy.lowers[name]:
        if program.live[below].batch is None:
            program.draw(below)
    if lv.batch is None:
        program.draw(name)
    if program.fsdp is not None:
        return program.fsdp.hypergradient(name)
    saved = [p.grad for p in lv.problem.params]
    for p in lv.problem.params:
        p.grad = None
    with frozen(buffers_of(program.modules.values())):
        program.hierarchy.hypergrad(name)
    out = {s: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
           for s, p in zip(lv.slots, lv.problem.params)}
    for p, g in zip(lv.problem.params, saved):
        p.grad = g
    return out



def _as_batches(value, dtype: torch.dtype | None, device: torch.device):
    """``value``, an evaluation's data argument, as the run's batches are: on ``device`` and,
    in a ``dtype`` run, cast (:func:`~mloc.runtime.program.data.cast_data`: a tensor or container
    now, an iterable batch by batch). On the CPU without ``dtype``, ``value`` itself: no
    wrapper, no work per batch."""
    device = None if device.type == "cpu" else device
    return value if dtype is None and device is None else cast_data(value, dtype, device)


def _start_of(lv: Live):
    """Where `reset` starts a `reinit` problem: its parameters as built (a copy), or its
    reinit call on its module."""
    if lv.spec.reinit is True:
        return tuple(t.detach().clone() for t in lv.problem.params)
    return lambda: lv.spec.reinit(lv.module)


def _stepper(draw: Callable[[], None], source: Source, pipeline: Pipeline) -> Callable[..., None]:
    """A problem's step: draw its next batch (unless told not to), take the gradients from
    ``source``, commit them through ``pipeline`` (the stages after the commit where the
    source committed them itself: a fused step, :mod:`mloc.runtime.compiled.fused`)."""
    seed = pipeline.seed
    run = pipeline.fusion.after if getattr(source, "fused", False) else pipeline.run

    def step(fresh: bool = True) -> None:
        if fresh:
            draw()
        grads, loss = source(seed)
        run(grads, loss)
    return step
