"""A program's compiled steps (`--compile`): which sources are wrapped, what they read, and
what each step reports.

:class:`Compiling` is owned by :class:`~mloc.runtime.program.engine.Program`. Under
``on`` it wraps the gradient sources of the lower and upper steps, an interlocking
chain's gradients (every stage's at once) and a vmapped meta-batch's solves
(:class:`~mloc.runtime.compiled.step.CompiledSource`), and compiles each problem's optimizer
commit (:meth:`Optimizer.compiled_commit <mloc.runtime.optim.base.Optimizer.compiled_commit>`);
a lower or upper step whose pipeline has no stage between gradient and update, of an
optimizer that allows it, runs its update in its own graph instead
(:class:`~mloc.runtime.compiled.fused.FusedStep`; the report says so, or why not);
an upper step under data parallelism holds its averaging (the direct gradient's,
each Hessian-vector product's, SAMA's lower gradient's) in its graph as functional
collectives (:class:`~mloc.runtime.base.overlap.OverlappedSync`), and its final
gradients are averaged after it by the pipeline, as a lower step's.
``auto`` is eager until the run loop decides (:mod:`mloc.runtime.compiled.decision`).

What a step reads, its inputs: every problem's parameters, the current batches of the
problem and (an upper step) of every problem below it, those problems' optimizer states
and tensor hyperparameters (an unroll steps the lower's optimizer; SAMA reads its moments
and step count; a method that reads none leaves them unused), every module buffer. The
plain values it may read (its signature beside the shapes): the modules' train/eval modes
and the batches' numbers; an optimizer state's numbers are lifted into inputs.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.utils._pytree as pytree

from mloc.runtime.base import tree
from mloc.runtime.compiled.decision import OpCount
from mloc.runtime.compiled.fused import FusedStep
from mloc.runtime.compiled.step import CommitReport, CompiledSource, StepReport, flatten_each, rebuild_each

ACCUMULATED = "the update applies the mean of several micro-steps' gradients (accumulate)"


class Compiling:
    """See the module docstring. ``reports`` by (kind, problem); ``steps`` is the program's
    table of step objects (built at their first use: cleared to build them again)."""

    def __init__(self, program: Any, mode: str, steps: dict):
        self.program, self.mode, self.steps = program, mode, steps
        self.reports: dict[tuple[str, str], Any] = {}
        self.decision: dict | None = None
        self.counter: OpCount | None = None                  # see `counting`
        self._fixed: tuple[list, frozenset] | None = None     # see `_fixed_ids`
        self._submodules: list | None = None                 # every module's submodules, for their modes
        if mode == "on":
            self._commits()

    @property
    def kinds(self) -> int:
        """How many step kinds (of a problem each) the schedule has run so far."""
        return len(self.steps)

    def switch(self, on: bool, decision: dict | None = None) -> None:
        """`auto`'s decision: from the next step on compiled (``on``) or eager; the step
        objects are built again at their next use. ``decision`` (whether, why, at which
        step) is what a checkpoint keeps of it (:meth:`state`)."""
        self.decision = decision
        self.mode = "on" if on else "off"
        self.steps.clear()
        if on:
            self._commits()

    def state(self) -> dict:
        """What a checkpoint keeps (``"compile"``): `auto`'s decision once made. A resumed
        run goes on with it (:meth:`restore`) instead of timing steps again, so it runs the
        same kind of step as the run it continues; timed again, a loaded machine could
        decide otherwise, and a compiled step is not bitwise an eager one."""
        return {"compile": self.decision} if self.decision else {}

    def restore(self, decision: dict | None) -> bool:
        """A checkpoint's decision (:meth:`state`), taken when this run is `auto`: an
        explicit ``--compile on|off`` overrides it. Whether it was taken."""
        if self.mode != "auto" or not isinstance(decision, dict) or not isinstance(decision.get("compile"), bool):
            return False
        self.switch(decision["compile"], decision)
        return True

    def report(self) -> list[dict]:
        """Per step: compiled or why not, graphs, operations, compiles beyond the first
        (recompiles), seconds spent compiling (``config.json``'s ``compiled``)."""
        return [{"step": f"{r.kind} {r.name}", "compiled": r.compiled, "reason": r.reason,
                 "graphs": r.graphs, "operations": r.operations, "recompiles": r.recompiles,
                 "update": "fused" if r.compiled and getattr(r, "fused", False) else getattr(r, "split", None),
                 **({"apart": r.apart} if getattr(r, "apart", None) else {}),
                 "compile_seconds": round(r.seconds, 3)} for r in self.ran()]

    def ran(self) -> list:
        """The reports of the steps that ran (or were refused): an optimizer commit a
        vmapped meta-batch never calls (its lower's updates are in the graph) is left out."""
        return [r for r in self.reports.values() if r.reason is not None or r.graphs]

    def source(self, kind: str, name: str, source: Any, pipeline: Any = None) -> Any:
        """``source`` (of a ``lower`` or ``upper`` step of ``name``), compiled where the run
        compiles: with the optimizer's update in its graph where ``pipeline`` (the
        problem's, None for an accumulation's micro-step) and the optimizer allow it (a
        :class:`~mloc.runtime.compiled.fused.FusedStep`, ``fused``: it commits, and the
        pipeline's ``fusion.after`` runs the rest), else why not in its report."""
        if self.mode != "on":
            return self._counted(source)
        report = self.reports[kind, name] = StepReport(kind, name)
        below = _below(self.program.hierarchy, name)
        batches = (name, *below) if kind == "upper" else (name,)
        states = below if kind == "upper" else ()
        live = self.program.live
        report.split = (ACCUMULATED if pipeline is None else pipeline.split
                        or live[name].problem.optimizer.unfused)
        if report.split is None:
            states = (*states, name)
            return FusedStep(source, pipeline.fusion, live[name].problem, lambda: self._tensors(batches, states),
                             lambda: self._numbers(batches), report, lifted=[live[n].problem for n in states])
        step = CompiledSource(source, lambda: self._tensors(batches, states), lambda: self._numbers(batches),
                              report, lifted=[live[n].problem for n in states])
        return _collectives_counted(step, self.program.sync) if self.program.dist.world > 1 else step

    def chain(self, first: str, gradients: Any) -> Any:
        """An interlocking chain's ``gradients`` (every stage's ``(grads, loss)`` at once,
        :class:`~mloc.runtime.grad.interlock.ChainStep`), compiled as one graph where the
        run compiles; each stage then commits through its own (compiled) optimizer."""
        if self.mode != "on":
            return self._counted(gradients)
        report = self.reports["chain", first] = StepReport("chain", first)
        stages = self.program.chains[first].stages
        return CompiledSource(gradients, lambda: self._tensors(stages, ()), lambda: self._numbers(stages[:1]),
                              report, outputs=(flatten_each, rebuild_each))

    def meta_batch(self, upper: str, solve: Any, args: Any) -> Any:
        """A vmapped meta-batch's ``solve`` (every task's solve and hypergradient at once,
        :class:`~mloc.runtime.grad.metabatch.MetaBatch`), compiled as one graph where the
        run compiles; it reads ``args()`` (the call's stacked starts and batches, the
        upper's parameters) besides the program's tensors. The upper's commit is compiled
        apart."""
        if self.mode != "on":
            return self._counted(solve) if self.mode == "auto" else None
        report = self.reports["meta_batch", upper] = StepReport("meta_batch", upper)
        names = tuple(self.program.live)
        return CompiledSource(solve, lambda: [*args(), *self._tensors((), names)], lambda: self._numbers(()),
                              report, outputs=(_pytree_flatten, _pytree_rebuild_like))

    @contextmanager
    def counting(self) -> Iterator[OpCount]:
        """Count the operations of the gradient sources (the work a capture would
        record; not the data draws, nor the commits) while active: `auto`'s estimate of
        the compile time (:mod:`mloc.runtime.compiled.decision`)."""
        self.counter = OpCount()
        try:
            yield self.counter
        finally:
            self.counter = None

    def _counted(self, source: Any) -> Any:
        """``source``, its operations counted while :meth:`counting` (under `auto`)."""
        if self.mode != "auto":
            return source

        def run(*args):
            if self.counter is None:
                return source(*args)
            with self.counter:
                return source(*args)
        return run

    def _commits(self) -> None:
        for name, lv in self.program.live.items():
            lv.compiled_step = lv.problem.optimizer.compiled_commit()
            self.reports["commit", name] = CommitReport(name, lv.compiled_step)

    def _tensors(self, batches: Sequence[str], states: Sequence[str]) -> list[torch.Tensor]:
        """The step's inputs (the module docstring), in a fixed order, each once: the
        batches and optimizer states named (which change from step to step), then every
        parameter and buffer (the same tensors every step, updated in place: listed once)."""
        out, seen = [], set(self._fixed_ids())
        for name in states:
            lv = self.program.live[name]
            for t in (*tree.tensors(lv.problem.state),
                      *(v for v in lv.problem.optimizer.hyper.items().values() if isinstance(v, torch.Tensor))):
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        for name in batches:
            for t in tree.tensors(self.program.live[name].batch):
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        return out + self._fixed[0]

    def _fixed_ids(self) -> frozenset:
        """The ids of every parameter and module buffer (``_fixed``: the list and the ids,
        built once: parameters and buffers are updated in place, never replaced)."""
        if self._fixed is None:
            tensors, ids = [], set()
            for lv in self.program.live.values():
                for t in lv.problem.params:
                    if id(t) not in ids:
                        ids.add(id(t))
                        tensors.append(t)
            for m in self.program.modules.values():
                for t in m.buffers():
                    if id(t) not in ids:
                        ids.add(id(t))
                        tensors.append(t)
            self._fixed = (tensors, frozenset(ids))
        return self._fixed[1]

    def _numbers(self, batches: Sequence[str]) -> tuple:
        """The plain values the step may read (the module docstring)."""
        if self._submodules is None:
            self._submodules = [m for module in self.program.modules.values() for m in module.modules()]
        modes = tuple(m.training for m in self._submodules)
        return modes, tuple(_plain_leaves(self.program.live[n].batch) for n in batches)


def _pytree_flatten(result) -> tuple:
    return tuple(pytree.tree_leaves(result))


def _pytree_rebuild_like(result):
    spec = pytree.tree_structure(result)
    return lambda flat: pytree.tree_unflatten(list(flat), spec)


def _below(hierarchy, name: str) -> tuple[str, ...]:
    """The problems below ``name`` (its lowers, theirs, ...), each once."""
    out, todo = [], [name]
    while todo:
        for lower in sorted(hierarchy.lowers.get(todo.pop(), ())):
            if lower not in out:
                out.append(lower)
                todo.append(lower)
    return tuple(out)


def _plain_leaves(value) -> tuple:
    """The leaves of a pytree that are not tensors (numbers, strings), in order."""
    if isinstance(value, torch.Tensor):
        return ()
    if isinstance(value, (tuple, list)):
        return tuple(x for v in value for x in _plain_leaves(v))
    if isinstance(value, dict):
        return tuple(x for k, v in value.items() for x in (k, *_plain_leaves(v)))
    return (value,)


def _collectives_counted(step: Any, sync: Any) -> Any:
    """``step`` (a compiled step under data parallelism), its collectives counted per call
    as an eager step counts them (``sync.counts``, the train records' ``collectives``): a
    replayed graph runs its functional collectives without Python, so a call that counted
    none counts those of the last call that ran Python (the capture, or an eager step)."""
    last = [0]

    def run(seed=None):
        before = sync.counts.get(sync.owner, 0)
        out = step(seed)
        n = sync.counts.get(sync.owner, 0) - before
        if n:
            last[0] = n
        elif last[0]:
            sync.replayed(last[0])
        return out
    return run
