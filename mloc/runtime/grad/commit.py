"""One commit pipeline per problem: every gradient source feeds it.

A training step of a problem is ``grads, loss = source(pipeline.seed)`` followed by
``pipeline.run(grads, loss)`` (:mod:`mloc.runtime.grad.sources` holds the sources). The
pipeline is built once per problem, with only the stages that apply, in this order:

========== ==================================================================== ============
stage      what it does                                                         built when
========== ==================================================================== ============
.grad      puts ``grads`` into the parameters' ``.grad`` (the next three act on  any of the
           it, in place) and frees it after the commit, as a hand-written loop   next three
           drops its gradients
all-reduce averages ``.grad`` across processes (nothing when the source       world > 1
           averaged them during its backward: :mod:`mloc.runtime.base.overlap`)
unscale    ``GradScaler.unscale_``: divides by the loss scale the source         fp16 (CUDA)
           applied through ``seed`` (dynamic loss scaling, Micikevicius et al.,
           ICLR 2018)
clip       ``clip_grad_norm_`` (the total 2-norm, foreach)                      clip_grad_norm
finite     watches the loss (or, for a source without one, the gradients, as     always
           the problem's "hypergradient") for NaN/Inf on the device, without a
           host sync (:class:`~mloc.runtime.grad.finite.FiniteGuard`); under loss
           scaling only the loss: an overflow is the scaler's business; on a
           logged step, also queues the gradients' 2-norm for the metrics
commit     the schedule (the rate, and what else a torch scheduler drives), then   always
           the optimizer's step in place
           (:func:`optimizer_commit`; a parameter no gradient reached, marked
           by the source, is left as it was, with its optimizer state, as
           ``torch.optim`` skips a ``.grad`` of None); under loss scaling through
           ``GradScaler.step``, which skips it when the unscaled gradients are
           not finite, then ``GradScaler.update``
project    the program's ``project`` call on the problem's module, under         project
           ``no_grad`` (Betty's ``param_callback``: e.g. clamp λ ≥ 1e-8)
committed  watches everything the step committed, the parameters and the         always
           optimizer state's floating tensors (``Optimizer.committed``), for
           NaN/Inf (:func:`committed_watcher`)
========== ==================================================================== ============

**What the watches promise.** Every tensor a step commits is checked, whatever made it
non-finite: the loss, one gradient entry under a finite loss, the hypergradient, an
optimizer statistic that overflowed on finite gradients (Adam's ``g²``), a root Shampoo
installed, the user's ``project``. The check is the guard's: each watch queues one fused
kernel on the device (``_amp_foreach_non_finite_check_and_unscale_`` with factor 1, which
sets a flag and changes nothing; the loss costs no kernel: it is kept as it is), and the
flags are read together at the next log step or checkpoint, one host synchronisation per
log interval as before; none per step. A step that failed is named (step, problem, what,
in watch order: the loss or the hypergradient, then the committed state: a NaN gradient
entry under a finite loss is named as the parameters or optimizer state it reached) and
no checkpoint is written after it, so the checkpoint the report names is the last one
before it, all finite. The step itself is not undone in memory: masking it on the device
(``torch.where(ok, new, old)``) needs a copy of the parameters and optimizer state before
every commit and a selection per tensor after it, ~2.5 × the commit itself on the CPU
(a 64-256-10 MLP under SGD, one thread, CPU time: copy 3.7 µs and four ``where`` 16.7 µs,
against 7.9 µs for the commit and 4.1 µs for the check), and the run stops at the next
check anyway. Nothing reads the state in between without a check first: logs,
evaluations, ``best.pt`` and checkpoints (:meth:`mloc.runtime.program.engine.Program.state_dict`
checks the watches and verifies the whole state).

The step counter of the problem is advanced last. An fp32 single-process step is thus
``finite``, ``commit`` and ``committed`` on the gradients as the source returned them:
the lines a hand-written loop runs, plus keeping the detached loss (a lower problem) or
checking the hypergradient (an upper one), and one fused check of what was committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from mloc.runtime.base.overlap import OverlappedSync
from mloc.runtime.grad.finite import COMMITTED, FiniteGuard
from mloc.runtime.optim.base import commit_present
from mloc.runtime.base.precision import ScaledStep
from mloc.runtime.base.tree import Params, absent, marked

Seed = Callable[[Tensor], Tensor]
"""What a source applies to its loss before differentiating it (the loss scaler's ``scale``)."""

Run = Callable[[Params, "Tensor | None"], None]


@dataclass(frozen=True)
class Pipeline:
    """A problem's built commit pipeline (see the module docstring).

    ``run(grads, loss)`` commits one step from ``grads`` (dense, one per parameter; the
    pipeline may overwrite them in place); ``loss`` is the source's detached loss, or
    None. ``seed`` is what the source must apply to its loss before differentiating
    (None: nothing). ``on_grad`` says the stages act on ``.grad``: a source that can
    leave its gradients there itself, laid out as ``loss.backward()`` lays them out,
    should (the ``.grad`` stage then finds them in place)."""

    stages: tuple[str, ...]
    seed: Seed | None
    on_grad: bool
    run: Run
    fusion: "Fusion | None" = None
    split: str | None = None        # why the optimizer update cannot join the gradient's graph


@dataclass(frozen=True)
class Fusion:
    """What a step whose compiled graph also runs the optimizer's update (a *fused* step,
    :mod:`mloc.runtime.compiled.fused`) takes from the pipeline: ``schedule()``, run before
    the graph (the rate it writes is one of the graph's inputs); ``commit(grads)``, the
    optimizer's step without the schedule, for the step's eager fallback; ``after(grads,
    loss)``: every stage but the commit (the watches, ``project``, the step counter)."""

    schedule: Callable[[], None]
    commit: Callable[[Params], None]
    after: Run


def build_pipeline(lv: Any, dist: OverlappedSync, guard: FiniteGuard, clock: Any, upper: bool) -> Pipeline:
    """The pipeline of the problem whose runtime state is ``lv``
    (:class:`mloc.runtime.program.build.Live`: its ``problem``, ``spec``, ``scaler``, ``commit``;
    ``last_loss`` and ``steps`` are written). ``clock.step_count + 1`` is the step a
    watch records (1-based, as logged); ``upper``: the problem has lower problems (its
    gradients' norm is logged as ``hypergrad_norm``). ``dist`` averages across replicas:
    the all-reduce stage skips gradients it averaged already, during the backward
    (:meth:`~mloc.runtime.base.overlap.OverlappedSync.reduced`)."""
    params, scaler, clip = lv.problem.params, lv.scaler, lv.spec.clip_grad_norm
    commit, seed = lv.commit, None
    acts: dict[str, Callable[[], None]] = {}        # the stages acting on .grad, in order
    if dist.world > 1:
        acts["all-reduce"] = lambda: dist.reduced([p.grad for p in params]) or dist.allreduce_grads(params)
    if scaler is not None:
        proxy = ScaledStep(params, lambda: lv.commit(tuple(p.grad for p in params)))
        acts["unscale"] = lambda: scaler.unscale_(proxy)
        commit, seed = _scaled(scaler, proxy), scaler.scale
    if clip is not None:
        acts["clip"] = lambda: torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
    project = lv.spec.project
    if project is not None:
        commit = _projected(commit, project, lv.module)
    run = _finite(lv, guard, clock, commit, watch_grads=scaler is None, upper=upper)
    fusion, split = None, None
    if acts:
        run = _on_grad(params, tuple(acts.values()), run)
        split = _SPLIT[next(iter(acts))]
    else:
        after = _projected(_nothing, project, lv.module) if project is not None else _nothing
        fusion = Fusion(scheduled(lv) or _none, optimizer_step(lv),
                        _finite(lv, guard, clock, after, watch_grads=True, upper=upper))
    stages = (((".grad", *acts) if acts else ()) + ("finite", "commit") + (("project",) if project else ())
              + ("committed",))
    return Pipeline(stages, seed, bool(acts), run, fusion, split)


_SPLIT = {
    "all-reduce": ("under data parallelism the gradients are averaged across processes between the gradient "
                   "and the update, a collective the captured graph does not hold"),
    "unscale": "fp16 loss scaling unscales and checks the gradients between the gradient and the update",
    "clip": "clip_grad_norm clips the gradients (in .grad) between the gradient and the update",
}
"""Why a pipeline stage between the gradient and the update keeps them in separate graphs."""


def _nothing(grads: Params) -> None:
    return None


def _none() -> None:
    return None


def optimizer_commit(lv: Any) -> Callable[[Params], None]:
    """``commit(grads)``: the schedule (:func:`scheduled`), then the optimizer's step in
    place (:func:`optimizer_step`)."""
    schedule, step = scheduled(lv), optimizer_step(lv)
    if schedule is None:
        return step

    def commit(grads: Params) -> None:
        schedule()
        step(grads)
    return commit


def scheduled(lv: Any) -> Callable[[], None] | None:
    """``schedule()``: writes the hyperparameters the problem's schedule sets for its next
    step (None: no schedule). The schedule (``lv.schedule``, bound to the optimizer) reads
    ``lv.steps``: ``lv.rate`` writes the rate, and ``lv.drive`` the other hyperparameters
    a torch scheduler drives (OneCycleLR's momentum)."""
    schedule, rate, drive, base = lv.schedule, lv.rate, lv.drive, lv.spec.lr
    if schedule is None:
        return None

    def run() -> None:
        rate(base * schedule(lv.steps))
        if drive is not None:
            drive(schedule.values(lv.steps))
    return run


def optimizer_step(lv: Any) -> Callable[[Params], None]:
    """``step(grads)``: the optimizer's step in place (:meth:`Optimizer.commit`, or
    ``lv.compiled_step``, its compiled form, where the run compiles:
    :meth:`Optimizer.compiled_commit`); a parameter no gradient reached, marked by the
    source, is left as it was, with its optimizer state. The optimizer state is read from
    and written to ``lv.problem`` at every call (a restore replaces it)."""
    problem = lv.problem
    no_grad = torch.no_grad()      # one context object, entered once per commit
    params, eager, optimizer = problem.params, problem.optimizer.commit, problem.optimizer

    def step(grads: Params) -> None:
        missing = absent(grads)
        commit = lv.compiled_step or eager
        with no_grad:
            if missing:     # parameters no gradient reached: left as torch.optim leaves them
                problem.state = commit_present(optimizer, grads, problem.state, params, missing, commit)
            else:
                problem.state = commit(grads, problem.state, params)
    return step


def _projected(commit: Callable[[Params], None], project: Callable, module) -> Callable[[Params], None]:
    """``commit``, then ``project(module)`` under ``no_grad``."""
    def run(grads: Params) -> None:
        commit(grads)
        with torch.no_grad():
            project(module)
    return run


def committed_watcher(lv: Any, guard: FiniteGuard) -> Callable[[int], None]:
    """``keep(step)``: queue one fused NaN/Inf check of everything a step of ``lv``'s problem
    committed, its parameters and ``Optimizer.committed(state)`` (named
    :data:`~mloc.runtime.grad.finite.COMMITTED`). For every writer of a problem's parameters and
    state: the pipeline's commit, a meta-batch's vectorized solve."""
    problem = lv.problem
    params, committed = problem.params, problem.optimizer.committed
    keep = guard.grads_watcher(lv.spec.name, COMMITTED)

    def watch(step: int) -> None:
        keep(step, params + committed(problem.state))
    return watch


def _finite(lv: Any, guard: FiniteGuard, clock: Any, commit: Callable[[Params], None],
            watch_grads: bool, upper: bool) -> Run:
    """The finite stage, then ``commit``, then the committed stage and the step counter."""
    name = lv.spec.name
    keep_loss, keep_grads = guard.loss_watcher(name), guard.grads_watcher(name, "hypergradient")
    keep_state = committed_watcher(lv, guard)
    keep_norm = guard.norms.watcher(name, "hypergrad_norm" if upper else "grad_norm")   # logged steps only

    def run(grads: Params, loss: Tensor | None) -> None:
        step = clock.step_count + 1
        if loss is not None:
            lv.last_loss = loss
            keep_loss(step, loss)
        elif watch_grads:
            keep_grads(step, grads)
        keep_norm(grads)
        commit(grads)
        keep_state(step)
        lv.steps += 1
    return run


def _on_grad(params: Params, acts: tuple[Callable[[], None], ...], then: Run) -> Run:
    """The ``.grad`` stage around ``acts`` (the stages acting on ``.grad``, in order)."""
    def run(grads: Params, loss: Tensor | None) -> None:
        for p, g in zip(params, grads):
            p.grad = g
        for act in acts:
            act()
        then(marked([p.grad for p in params], absent(grads)), loss)
        for p in params:
            p.grad = None
    return run


def _scaled(scaler: torch.amp.GradScaler, proxy: ScaledStep) -> Callable[[Params], None]:
    """The commit under loss scaling: ``scaler.step`` runs the optimizer's commit (the
    proxy's step, from the unscaled ``.grad``) unless they overflowed (the scale is then
    halved; otherwise it grows every 2000 steps), then ``scaler.update``."""
    def commit(grads: Params) -> None:
        scaler.step(proxy)
        scaler.update()
    return commit
