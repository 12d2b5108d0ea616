r"""A meta-batch solved at once: k tasks' lower problems vectorized with ``torch.func.vmap``.

An upper problem ``U`` with ``accumulate = k`` averages k hypergradients, each after its
own solve of its lower problem ``L`` from the same kind of start (``init = U`` or
``reinit``): MAML's and iMAML's meta-batch of tasks. One after another (the default)
that is k × (reset, K lower steps, hypergradient). With ``vmap = true`` the k solves are
one computation over a leading task dimension i:

.. math::
    δ^{(i)}_0 = \text{start}^{(i)},\quad s^{(i)}_0 = \text{init}(δ^{(i)}_0),\quad
    (u, s^{(i)}_{j+1}) = \text{update}(∇_δ f(x, δ^{(i)}_j; b^{(i)}_j), s^{(i)}_j, δ^{(i)}_j),\
    δ^{(i)}_{j+1} = δ^{(i)}_j + u

.. math::
    g^{(i)} = ∂_x F(x, δ^{(i)}_K; c^{(i)}) - ∂_x ⟨∇_δ f(x, δ^{(i)}_K; b^{(i)}_{K-1}), q^{(i)}⟩,\quad
    q^{(i)} ≈ H^{(i)\,-1} ∂_δ F \quad(\text{no second term for first\_order}),

and ``U`` steps on :math:`\frac1k \sum_i g^{(i)}`. ``f``, ``F`` are the problems' own
bound losses (``init`` offsets included); ``b``, ``c`` their batches, drawn beforehand in
exactly the order the sequential schedule draws them, so the data streams end where they
would. torch.func's transforms stand in for autograd: ``grad`` for gradients, reverse-over-
reverse ``vjp(grad)`` for the Hessian-vector products the method's own solver takes
(``cg.solve``, ``neumann.solve``), ``grad`` of ``⟨∇_δ f, q⟩`` for the mixed product. The
numbers are the sequential path's up to the order of floating-point sums (the tests:
1e-12 in float64). Afterwards ``L`` holds the last task's solution and optimizer state,
as it does sequentially.

Precision: the lower's training steps run their forwards in the lower's autocast context
(``bf16``), their backwards outside it. The linearization ``f`` that ``cg`` and ``neumann``
solve with runs in full precision, as it does sequentially
(:meth:`~mloc.runtime.grad.problem.LowerOp.grad`). So does ``F``: under ``vmap`` a loss
such as ``mse_loss`` is decomposed into elementwise ops before autocast sees it, so
autocast's float32 list no longer covers it, and a bf16 ``F`` put iMAML's first_order
meta-update 2.3 % off float32's, against 0.34 % for the same step solved task by task;
with ``F`` in full precision, 0.085 %.

What the checker (E219) requires: two levels, one lower that restarts each micro-step,
a method whose descriptor declares ``task_vmap`` (``cg``, ``neumann``, ``first_order``),
a functional lower optimizer with no schedule, clipping, projection or accumulation.
What only the run knows: the modules the losses read hold no buffers (BatchNorm's
running statistics cannot be updated per task), one process, no fp16 loss scaling;
otherwise the tasks are solved one after another, with a note.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
from torch.func import grad, vjp, vmap

from mloc.runtime.base import tree
from mloc.runtime.grad.commit import committed_watcher
from mloc.runtime.optim.base import apply_updates


class _TaskOp:
    """The lower problem linearized at one task's solution, for a method's ``solve``:
    ``hvp(p) = ∇²_δδ f · p``, the VJP of the gradient map (``H`` is symmetric), its
    linearization taken once (Pearlmutter's reverse-over-reverse product, vmappable)."""

    def __init__(self, grad_at: Callable, theta):
        self.theta = theta
        _, self._vjp = vjp(grad_at, theta)

    def hvp(self, p, create_graph: bool = False):
        return self._vjp(tuple(p))[0]


class MetaBatch:
    """``U``'s meta-batch of ``tasks`` lower solves of ``steps`` steps each, vectorized."""

    def __init__(self, program, upper: str, tasks: int, steps: int, compiled: Callable | None = None):
        (lower,) = program.hierarchy.lowers[upper]
        self.program, self.upper, self.lower = program, upper, lower
        self.tasks, self.steps = tasks, steps
        live = program.live
        self.U, self.L = live[upper], live[lower]
        self.method = program.hierarchy.methods[lower]
        self.fallback = _why_not(program, upper, lower)
        self._keep_lower = None          # the NaN/Inf watch of what the solves commit to `lower`
        self._args: tuple = ()           # the current call's (x, starts, batches): see `_solve`
        self._solve = compiled(self._vmapped, lambda: [t for a in self._args for t in a]) if compiled else None
        if self.fallback:
            print(f"note: `{upper}` solves its {tasks} tasks one after another, not with vmap: "
                  f"{self.fallback}", file=sys.stderr)

    def __call__(self) -> None:
        if self.fallback:
            return self._sequential()
        program, L, U = self.program, self.L, self.U
        starts, lower_batches, upper_batches = [], [], []
        for _ in range(self.tasks):                 # the sequential order of resets and draws
            program.reset(self.lower)
            starts.append(tuple(t.detach().clone() for t in L.problem.params))
            task = []
            for _ in range(self.steps):
                program.draw(self.lower)
                task.append(L.batch)
            lower_batches.append(task)
            program.draw(self.upper)
            upper_batches.append(U.batch)
        last_lower, last_upper = L.batch, U.batch
        stacked_starts = tuple(torch.stack(ts) for ts in zip(*starts))
        lb_template, ub_template = lower_batches[0][0], upper_batches[0]
        lb = _stacked(self.lower, lambda: _stack_tasks(lower_batches))
        ub = _stacked(self.upper, lambda: _stack(upper_batches))
        self._templates = (lb_template, ub_template)
        x = tuple(t.detach() for t in U.problem.params)   # torch.func differentiates; autograd need not
        self._args = (x, stacked_starts, tuple(lb), tuple(ub))
        try:
            hyper, finals, flat_state, losses = (self._solve or self._vmapped)()
        finally:
            L.batch, U.batch = last_lower, last_upper
            self._args = ()
        with torch.no_grad():
            grads = []
            for g in hyper:                 # Σᵢ in task order, then ÷ k, as the accumulator does
                s = g[0].clone()
                for i in range(1, self.tasks):
                    s.add_(g[i])
                grads.append(s.div_(self.tasks))
            for p, f in zip(L.problem.params, finals):
                p.copy_(f[-1])
            L.problem.state = tree.replace_tensors(self._state_like, [t[-1] for t in flat_state])
        L.steps += self.tasks * self.steps
        L.last_loss = losses[-1, -1].detach()
        program.guard.loss_watcher(self.lower)(program.step_count + 1, losses.sum().detach())
        if self._keep_lower is None:
            self._keep_lower = committed_watcher(L, program.guard)
        self._keep_lower(program.step_count + 1)
        program.pipeline(self.upper).run(tuple(grads), None)

    def _vmapped(self, seed=None):
        """Every task's solve and hypergradient at once (``vmap`` over the tasks), from the
        current call's ``_args``; a pure function of them and the program's tensors, which
        the run may compile as one graph (:meth:`mloc.runtime.program.compiling.Compiling.meta_batch`)."""
        x, starts, lb, ub = self._args
        holder = {}
        out = vmap(self._task(x, *self._templates, holder), randomness="same")(starts, list(lb), list(ub))
        self._state_like = holder["state"]      # the optimizer state's structure (its tensors empty)
        return out

    def _task(self, x, lb_template, ub_template, holder):
        """One task's solve and hypergradient, written for ``vmap`` (over the start and the
        batches; ``x``, the upper's parameters, is shared)."""
        L, U, method, steps = self.L, self.U, self.method, self.steps
        optimizer = getattr(L.problem.optimizer, "inner", L.problem.optimizer)   # zero: the whole state, per task
        lower_loss, upper_loss = L.problem.loss, U.problem.loss
        lower_reads, upper_reads = L.problem.reads, U.problem.reads
        points = {n: lv.problem.params for n, lv in self.program.live.items()}
        lower_name, upper_name = self.lower, self.upper
        up = self.program.hierarchy.composition(upper_name).up
        implicit = any(step[0] == lower_name for step in up)   # cg, neumann: a solve; first_order: none

        def args(reads, xx, d):
            return [d if r == lower_name else xx if r == upper_name else points[r] for r in reads]

        def f(xx, d, batch):            # the linearization cg and neumann solve with: full precision
            L.batch = batch
            return lower_loss(*args(lower_reads, xx, d))

        def f_step(xx, d, batch):       # a training step's forward, in the lower's precision
            with L.autocast():
                return f(xx, d, batch)

        def F(xx, d, batch):            # full precision: see the module docstring
            U.batch = batch
            return upper_loss(*args(upper_reads, xx, d))

        def task(start, lower_flat, upper_flat):
            d = start
            state = optimizer.init(d)
            losses = []
            for j in range(steps):
                batch = tree.replace_tensors(lb_template, [t[j] for t in lower_flat])
                g, loss = grad(lambda dd: _with_aux(f_step(x, dd, batch)), has_aux=True)(d)
                updates, state = optimizer.update(g, state, d)
                d = apply_updates(d, updates)
                losses.append(loss)
            upper_batch = tree.replace_tensors(ub_template, list(upper_flat))
            direct, v = grad(lambda xx, dd: F(xx, dd, upper_batch), argnums=(0, 1))(x, d)
            if implicit:
                op = _TaskOp(lambda dd: grad(lambda e: f(x, e, batch))(dd), d)
                q = method.solve(op, v)

                def pairing(xx):
                    return tree.dot(grad(lambda e: f(xx, e, batch))(d), q)
                mixed = grad(pairing)(x)
                hyper = tuple(a - b for a, b in zip(direct, mixed))
            else:
                hyper = tuple(direct)
            holder["state"] = tree.map_tensors(state, lambda t: torch.empty(0))
            return hyper, d, tuple(tree.tensors(state)), torch.stack(losses)
        return task

    def _sequential(self) -> None:
        """The same meta-batch, one task after another (the schedule's default form)."""
        program = self.program
        for _ in range(self.tasks):
            program.reset(self.lower)
            for _ in range(self.steps):
                program.lower_step(self.lower)
            program.accumulate(self.upper)
        program.apply(self.upper)


def _with_aux(loss):
    return loss, loss.detach()


def _stack(batches: list) -> list:
    """The tensors of equally shaped batches, each stacked along a new leading dimension."""
    flats = [tree.tensors(b) for b in batches]
    return [torch.stack(ts) for ts in zip(*flats, strict=True)]


def _stack_tasks(tasks: list[list]) -> list:
    """Per task, its steps' batches: tensors of shape (tasks, steps, ...)."""
    per_task = [_stack(task) for task in tasks]
    return [torch.stack(ts) for ts in zip(*per_task, strict=True)]


class MetaBatchError(Exception):
    """The program's batches cannot be stacked over tasks (exit 1, E702); ``frames`` say
    what `vmap = true` needs, as the launcher reports a program error's locations."""

    def __init__(self, message: str, problem: str):
        super().__init__(message)
        self.frames = [f"`vmap = true` (docs/language.md): every task's batches of `{problem}` "
                       "must have the same shapes and one structure; drop `vmap` to solve the "
                       "tasks one after another"]


def _stacked(problem: str, stack: Callable[[], list]) -> list:
    """``stack()``, or a :class:`MetaBatchError` naming ``problem`` when its batches differ."""
    try:
        return stack()
    except (RuntimeError, ValueError) as e:
        raise MetaBatchError(f"the tasks' batches of `{problem}` cannot be stacked: {e}", problem) from None


def _why_not(program, upper: str, lower: str) -> str | None:
    """Why this run cannot vectorize the meta-batch (None: it can)."""
    if program.dist.world > 1:
        return "data parallelism averages each Hessian-vector product across processes"
    for name in (upper, lower):
        if program.live[name].scaler is not None:
            return f"`{name}` trains in fp16 with loss scaling"
    reads = set(program.live[upper].problem.reads) | set(program.live[lower].problem.reads)
    for r in sorted(reads):
        if any(True for _ in program.live[r].module.buffers()):
            return f"`{r}`'s module has buffers (e.g. BatchNorm statistics), which vmap cannot update per task"
    return None
