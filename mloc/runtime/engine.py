"""The training engine a compiled program's `train.py` drives.

Generated code declares the program (`ProblemSpec`s, hierarchy `Edge`s, the semantics the
planner chose) and its schedule (`outer_step`, a few plain lines calling `lower_step`,
`upper_step`, `draw`, `reset`); `Program` does the bookkeeping those lines need:

- building: seed, modules (in source order), trainable parameters, data streams, runtime
  `Problem`s whose losses are `BoundLoss`es, the `Hierarchy`;
- stepping: a lower step is a plain gradient step on the problem's own loss; an upper step
  writes the hypergradient into `.grad` (one backward), clips, averages across processes
  and commits the optimizer step; every loss and gradient is watched for NaN/Inf on the
  device, without a host synchronisation per step;
- state: `state_dict()`/`load_state_dict()` cover parameters, optimizer states, module
  buffers, data positions, RNGs and the step counter, so a resumed run is bitwise
  identical to an uninterrupted one on CPU.

Step semantics (what a hand-written loop must do to match): each step of a problem draws
the next batch from its own data stream; an upper problem's hypergradient is taken at the
lower problems' current parameters with their most recent batches; `itd` unrolls from the
lower's current point on its current batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from mloc.runtime import optim, tree
from mloc.runtime.binding import BoundLoss, select_parameters
from mloc.runtime.checkpoint import capture_rng, restore_rng, state_to_tree, tree_to_state
from mloc.runtime.compose import Edge, Hierarchy
from mloc.runtime.data import DataStream, map_tensors
from mloc.runtime.distributed import DistContext
from mloc.runtime.metrics import FiniteGuard
from mloc.runtime.precision import NULL_CONTEXT as _NULL, ScaledStep, autocast_factory, grad_scaler_for
from mloc.runtime.problem import Problem


@dataclass(frozen=True)
class ProblemSpec:
    """One problem as the generated code declares it.

    `loss(*modules, batch)` takes the modules of `reads` (the problems the loss names, in
    order). `optimizer(lr)` builds the functional optimizer; `schedule(step) -> factor`
    scales the learning rate (None: constant). `init` names the problem whose parameters
    this one starts from at every `reset`.
    """

    name: str
    reads: tuple[str, ...]
    loss: Callable
    optimizer: Callable[[Any], optim.Optimizer]
    lr: float
    trainable: tuple[str, ...] = ("*",)
    frozen: tuple[str, ...] = ()
    init: str | None = None
    clip_grad_norm: float | None = None
    precision: str | None = None
    schedule: Callable[[int], float] | None = None


@dataclass
class RunConfig:
    steps: int = 1000
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    dtype: str | None = None          # e.g. "float64" for exact checks


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


@dataclass
class _Live:
    """Runtime state of one problem."""

    spec: ProblemSpec
    module: nn.Module
    params: tuple                        # the trainable tensors (δ for an `init` problem)
    slots: list[str]
    lr: Any
    autocast: Callable[[], Any] = None   # the problem's precision context, built once
    scaler: Any = None                   # a GradScaler for fp16 on CUDA, else None
    problem: Problem | None = None       # set once every problem's parameters exist
    commit: Callable | None = None       # commit(grads): the optimizer step, bound once
    batch: tuple = ()
    last_loss: torch.Tensor | None = None
    steps: int = 0


class Program:
    """A compiled program, instantiated: call `outer_step()` to train one top-level step."""

    def __init__(self, *, name: str, specs: Sequence[ProblemSpec], edges: Sequence[Edge],
                 semantics: str, build_modules: Callable[[], dict], data: dict[str, Callable],
                 schedule: Callable[["Program"], None], config: RunConfig,
                 evaluations: Sequence[tuple[int, str, Callable]] = ()):
        self.name, self.config, self._schedule = name, config, schedule
        self.dist = DistContext.from_env()
        self.device = resolve_device(config.device, self.dist.local_rank)
        self.step_count = 0
        self.evaluations = tuple(evaluations)
        self.guard = FiniteGuard()
        _seed_everything(config.seed)
        self._cast = getattr(torch, config.dtype) if config.dtype else None
        self.modules = self._build_modules(build_modules)
        self.streams = {n: DataStream(n, f, device=self.device, rank=self.dist.rank, world=self.dist.world)
                        for n, f in data.items()}
        self.live = self._build_problems(specs)
        reduce = self.dist.mean if self.dist.world > 1 else None
        self.hierarchy = Hierarchy([lv.problem for lv in self.live.values()], edges, semantics, reduce)
        self.dist.broadcast_params([t for lv in self.live.values() for t in lv.problem.params])
        self._lower_fns: dict[str, Callable[[bool], None]] = {}    # built at first use
        self._upper_fns: dict[str, Callable[[], None]] = {}

    # --- building ---------------------------------------------------------------------
    def _build_modules(self, build: Callable[[], dict]) -> dict[str, nn.Module]:
        modules = build()
        for m in modules.values():
            m.to(device=self.device, dtype=self._cast) if self._cast else m.to(self.device)
        return modules

    def _build_problems(self, specs: Sequence[ProblemSpec]) -> dict[str, _Live]:
        live: dict[str, _Live] = {}
        for spec in specs:
            module = self.modules[spec.name]
            slots = select_parameters(module, spec.trainable, spec.frozen)
            named = dict(module.named_parameters())
            if spec.init is None:
                params = tuple(named[s] for s in slots)
            else:   # MAML: θ = θ_init + δ, δ starts at zero
                params = tuple(torch.zeros_like(named[s]).requires_grad_() for s in slots)
            for n, t in named.items():
                t.requires_grad_(n in slots and spec.init is None)
            lr = torch.tensor(spec.lr, device=self.device) if spec.schedule else spec.lr
            precision = spec.precision or self.config.precision
            autocast = autocast_factory(precision, self.device)
            scaler = grad_scaler_for(precision, self.device)
            live[spec.name] = _Live(spec, module, params, slots, lr, autocast,
                                    scaler if scaler.is_enabled() else None)
        for lv in live.values():    # every problem's parameters exist now: bind the losses
            lv.problem = self._problem(lv, live)
            lv.commit = self._committer(lv)
        return live

    def _problem(self, lv: _Live, live: dict[str, _Live]) -> Problem:
        """The runtime problem: its loss closure and the reads it implies."""
        reads = list(lv.spec.reads)
        extra = [live[r].spec.init for r in reads if live[r].spec.init and live[r].spec.init not in reads]
        runtime_reads = reads + list(dict.fromkeys(extra))
        offsets = {i: runtime_reads.index(live[r].spec.init) for i, r in enumerate(reads) if live[r].spec.init}
        bound = BoundLoss(lv.spec.loss, [live[r].module for r in reads], [live[r].slots for r in reads],
                          [live[r].params for r in runtime_reads], lambda: (lv.batch,),
                          offsets, module_count=len(reads))
        return Problem(lv.spec.name, lv.params, bound, tuple(runtime_reads), lv.spec.optimizer(lv.lr))

    # --- the schedule's vocabulary ------------------------------------------------------
    def draw(self, name: str) -> None:
        """Draw the next batch of `name` (its loss uses it until the next draw)."""
        batch = self.streams[name].next()
        if self._cast is not None:
            batch = _cast_floating(batch, self._cast)
        self.live[name].batch = batch

    def _drawer(self, name: str) -> Callable[[], None]:
        """:meth:`draw` for one problem, bound once."""
        if self._cast is not None:
            return lambda: self.draw(name)
        lv, next_batch = self.live[name], self.streams[name].next

        def draw() -> None:
            lv.batch = next_batch()
        return draw

    def lower_step(self, name: str, draw: bool = True) -> None:
        """One gradient step of `name` on its own loss (the lowest problems)."""
        fn = self._lower_fns.get(name)
        if fn is None:
            fn = self._lower_fns[name] = self._lower_step_fn(self.live[name])
        fn(draw)

    def _lower_step_fn(self, lv: _Live) -> Callable[[bool], None]:
        """`lower_step` for one problem, specialized at its first step: everything fixed for
        the run (the loss at the problem's own parameters, the optimizer's commit, the
        guard, whether there is a precision context, a loss scaler, an all-reduce or
        clipping) is resolved once, so a plain fp32 step runs the lines a hand-written
        loop would, plus keeping the detached loss for the NaN/Inf check."""
        name, spec, problem = lv.spec.name, lv.spec, lv.problem
        params, loss_at_own, autocast = problem.params, problem.loss.own, lv.autocast
        draw, grad = self._drawer(name), torch.autograd.grad
        keep_loss, commit = self.guard.loss_watcher(name), lv.commit
        bound = problem.loss
        reads = lv.spec.reads
        constant_others = bound.own_with_constants(reads.index(name)) if name in reads else None
        if constant_others is not None:   # the other problems' parameters as constants
            loss_at_own = constant_others
        elif not bound.offsets:           # the user's loss on the modules, called directly
            fn, modules = bound.fn, bound.modules

            def loss_at_own():
                return fn(*modules, lv.batch)
        plain = (self.dist.world == 1 and spec.clip_grad_norm is None and lv.scaler is None
                 and autocast() is _NULL)

        def plain_step(fresh: bool = True) -> None:
            if fresh:
                draw()
            loss = loss_at_own()
            grads = grad(loss, params, allow_unused=True)
            for g in grads:
                if g is None:   # rare: part of the problem's parameters is unused
                    grads = tree.dense(grads, params)
                    break
            lv.last_loss = loss = loss.data     # detached (the cheapest way)
            keep_loss(self.step_count + 1, loss)
            commit(grads)
            lv.steps += 1

        def step(fresh: bool = True) -> None:
            if fresh:
                draw()
            with autocast():
                loss = loss_at_own()
            if lv.scaler is not None:
                return self._scaled_lower_step(lv, loss)
            grads = grad(loss, params, allow_unused=True)
            for g in grads:
                if g is None:   # rare: part of the problem's parameters is unused
                    grads = tree.dense(grads, params)
                    break
            lv.last_loss = loss = loss.detach()
            for p, g in zip(params, grads):      # the all-reduce and the clipping act on .grad
                p.grad = g
            self._commit(lv, loss, None)
        return plain_step if plain else step

    def _scaled_lower_step(self, lv: _Live, loss) -> None:
        """fp16 on CUDA: dynamic loss scaling (Micikevicius et al., 2018). The scaled loss is
        differentiated, then :meth:`_scaled_commit`."""
        params = lv.problem.params
        grads = torch.autograd.grad(lv.scaler.scale(loss), params, allow_unused=True)
        for p, g in zip(params, grads):
            p.grad = torch.zeros_like(p) if g is None else g
        self._scaled_commit(lv, loss)

    def _scaled_upper_step(self, lv: _Live) -> None:
        """fp16 on CUDA, an upper problem: the hypergradient with its top loss scaled by the
        loss scaler. Every BR-VJP is homogeneous of degree one in the adjoint it is given
        (:meth:`Hierarchy.hypergrad`), so the hypergradient comes out scaled alike: the
        seed, the solves and the final backward all run on scaled values, where fp16
        does not underflow. Then :meth:`_scaled_commit`."""
        params, scaler = lv.problem.params, lv.scaler
        losses = []

        def seed(loss):
            losses.append(loss)
            return scaler.scale(loss)
        for p in params:
            p.grad = None
        with lv.autocast():
            self.hierarchy.hypergrad(lv.spec.name, True, seed)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._scaled_commit(lv, losses[0] if losses else None)

    def _scaled_commit(self, lv: _Live, loss) -> None:
        """The gradients in ``.grad`` are scaled: all-reduce, unscale, clip, then step unless
        they overflowed (the scale is then halved; otherwise it grows every 2000 steps).
        Overflow is the scaler's business, so only the (unscaled) loss is watched for
        NaN/Inf here."""
        params, scaler = lv.problem.params, lv.scaler
        if self.dist.world > 1:
            self.dist.allreduce_grads(params)
        proxy = ScaledStep(params, lambda: lv.commit(tuple(p.grad for p in params)))
        scaler.unscale_(proxy)
        if lv.spec.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, lv.spec.clip_grad_norm, foreach=True)
        if loss is not None:
            lv.last_loss = loss = loss.detach()
            self.guard.watch(self.step_count + 1, lv.spec.name, loss, "loss")
        scaler.step(proxy)
        scaler.update()
        for p in params:
            p.grad = None
        lv.steps += 1

    def upper_step(self, name: str) -> None:
        """Hypergradient of `name` through every problem below it, then its optimizer step."""
        fn = self._upper_fns.get(name)
        if fn is None:
            fn = self._upper_fns[name] = self._upper_step_fn(self.live[name])
        fn()

    def _upper_step_fn(self, lv: _Live) -> Callable[[], None]:
        """`upper_step` for one problem, specialized at its first step (see
        :meth:`_lower_step_fn`)."""
        name, spec = lv.spec.name, lv.spec
        params, autocast, draw = lv.problem.params, lv.autocast, self._drawer(name)
        hypergrad, commit = self.hierarchy.hypergrad, lv.commit
        watch = self.guard.grads_watcher(name, "hypergradient")
        plain = self.dist.world == 1 and spec.clip_grad_norm is None and lv.scaler is None
        fp32 = autocast() is _NULL

        def plain_step() -> None:
            draw()
            if fp32:
                grads = hypergrad(name, False)
            else:
                with autocast():
                    grads = hypergrad(name, False)
            if grads is None:   # parameters with no path to the loss get zeros
                grads = tree.zeros(params)
            else:
                for g in grads:
                    if g is None:
                        grads = tree.dense(grads, params)
                        break
            watch(self.step_count + 1, grads)
            commit(grads)
            lv.steps += 1

        def step() -> None:        # through .grad: the all-reduce and the clipping act on it
            draw()
            if lv.scaler is not None:
                return self._scaled_upper_step(lv)
            for p in params:
                p.grad = None
            with autocast():
                hypergrad(name)
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._commit(lv, None, None)
        return plain_step if plain else step

    def reset(self, name: str) -> None:
        """Start `name` again from its `init` problem's parameters (δ = 0, fresh optimizer)."""
        lv = self.live[name]
        with torch.no_grad():
            for p in lv.problem.params:
                p.zero_()
        lv.problem.state = lv.problem.optimizer.init(lv.problem.params)

    def _commit(self, lv: _Live, loss, grads) -> None:
        """Watch, then commit one optimizer step from ``grads`` (None: from ``.grad``, which
        is all-reduced and clipped first, and freed after the step, as a hand-written loop
        drops its gradients)."""
        problem, spec = lv.problem, lv.spec
        params = problem.params
        from_grad = grads is None
        if from_grad:
            if self.dist.world > 1:
                self.dist.allreduce_grads(params)
            if spec.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, spec.clip_grad_norm, foreach=True)
            grads = tuple(p.grad for p in params)
        step = self.step_count + 1     # 1-based, as logged
        if loss is not None:
            self.guard.watch(step, spec.name, loss, "loss")
        else:
            self.guard.watch(step, spec.name, grads, "hypergradient")
        lv.commit(grads)
        if from_grad:
            for p in params:
                p.grad = None
        lv.steps += 1

    def _committer(self, lv: _Live) -> Callable[[Sequence[torch.Tensor]], None]:
        """``commit(grads)``: the learning-rate schedule, then the optimizer's update, in
        place (``torch.optim``'s step when the optimizer has one). The optimizer state is
        read from and written to ``lv.problem`` at every call (a restore replaces it)."""
        problem, spec = lv.problem, lv.spec
        no_grad = torch.no_grad()      # one context object, entered once per commit
        opt, schedule, lr = problem.optimizer, spec.schedule, lv.lr
        params = problem.params
        step = opt.commit

        def commit(grads) -> None:
            if schedule is not None:
                lr.fill_(spec.lr * schedule(lv.steps))
            with no_grad:
                problem.state = step(grads, problem.state, params)
        return commit

    # --- driving ----------------------------------------------------------------------
    def outer_step(self) -> None:
        self._schedule(self)
        self.step_count += 1

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

    @torch.no_grad()
    def losses(self) -> dict[str, float]:
        """Each problem's loss on its current batch (one host sync; for logging)."""
        out = {}
        for name, lv in self.live.items():
            if not lv.batch:
                continue
            with lv.autocast():
                value = lv.problem.loss(*self.hierarchy._args[name])
            out[name] = float(value)
        return out

    def hypergradients(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each upper problem's hypergradient at the current state, without stepping."""
        out = {}
        for name, lv in self.live.items():
            if not self.hierarchy.lowers.get(name):
                continue
            for below in self.hierarchy.lowers[name]:
                if not self.live[below].batch:
                    self.draw(below)
            if not lv.batch:
                self.draw(name)
            saved = [p.grad for p in lv.problem.params]
            for p in lv.problem.params:
                p.grad = None
            self.hierarchy.hypergrad(name)
            out[name] = {s: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                         for s, p in zip(lv.slots, lv.problem.params)}
            for p, g in zip(lv.problem.params, saved):
                p.grad = g
        return out

    def evaluate(self) -> dict[str, float]:
        out = {}
        with torch.no_grad():
            for _, label, fn in self.evaluations:
                out[label] = float(fn(self))
        return out

    # --- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        problems = {}
        for name, lv in self.live.items():
            problems[name] = {"params": [p.detach().clone() for p in lv.problem.params],
                              "optimizer": state_to_tree(tree.clone(lv.problem.state)),
                              "module": {k: v.detach().clone() for k, v in lv.module.state_dict().items()},
                              "steps": lv.steps}
        return {"program": self.name, "step": self.step_count, "problems": problems,
                "data": {n: s.state() for n, s in self.streams.items()}, "rng": capture_rng()}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        for name, lv in self.live.items():
            saved = state["problems"][name]
            lv.module.load_state_dict(saved["module"])
            with torch.no_grad():
                for p, v in zip(lv.problem.params, saved["params"]):
                    p.copy_(v)
            # copies: commits overwrite the state's tensors in place (Optimizer.commit)
            lv.problem.state = tree.clone(tree_to_state(saved["optimizer"], lv.problem.state))
            lv.steps = int(saved["steps"])
        for n, s in self.streams.items():
            s.restore(state["data"][n])
        for name, lv in self.live.items():
            lv.batch = ()
        restore_rng(state["rng"])


def _cast_floating(batch, dtype):
    return map_tensors(batch, lambda t: t.to(dtype) if t.is_floating_point() else t)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
