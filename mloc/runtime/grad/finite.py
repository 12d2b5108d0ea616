"""A guard that notices NaN/Inf in what a training step computes and commits, without
stalling the device.

The loss means the metrics report (:mod:`mloc.runtime.run.metrics`) cost no host sync per
step: the losses are the values :class:`FiniteGuard` keeps on the device anyway, summed
when the guard reads them at a log boundary (:meth:`FiniteGuard.means`). The gradient norms
are queued only on the step that ends a log interval (:class:`GradNorms`, the guard's
``norms``), kept on the device and read with the means.

:class:`FiniteGuard` watches losses and gradients. :meth:`FiniteGuard.watch` only queues
device work (it keeps one 0-dim value per watch on the device: the loss itself, or a flag
that one fused kernel sets when any of a problem's gradients is NaN or Inf): it never
calls ``.item()``, so the training loop does not synchronise with the device every step.
:meth:`FiniteGuard.check`, called at log and checkpoint boundaries, reads the kept values with one transfer, finds the first non-finite
one and raises :class:`NonFiniteError` naming the step and problem (in watch order) it
came from.

:func:`verify_state` checks a whole state (parameters and optimizer states) at once, before
a checkpoint is written.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor


_VALUE, _FLAG, _REDUCED = 0, 1, 2     # what a kept record is: a 0-dim value, a pool flag, a reduction


def _inexact(t: Tensor) -> bool:
    """Floating or complex: integer and bool tensors are always finite."""
    return t.is_floating_point() or t.is_complex()


COMMITTED = "parameters or optimizer state"
"""What the watch after every commit names (:func:`mloc.runtime.grad.commit.committed_watcher`)."""


class NonFiniteError(Exception):
    """The ``what`` (loss, gradient, ...) of ``problem`` was NaN or Inf at ``step``; ``held``:
    found in the state after ``step`` (by :func:`verify_state`, before a checkpoint),
    not by the watch of the step that wrote it."""

    def __init__(self, problem: str, step: int, what: str, held: bool = False):
        when = f"held NaN or Inf after step {step}" if held else f"became NaN or Inf at step {step}"
        super().__init__(f"the {what} of problem `{problem}` {when}")
        self.problem, self.step, self.what, self.held = problem, step, what, held
        self.note = None
        if held:
            self.note = ("found in the state before writing a checkpoint, not by the watch of a step: "
                         "something outside a step's commit wrote it")
        elif what == COMMITTED:
            self.note = ("its loss (or hypergradient) was finite at that step: a NaN or Inf gradient entry, "
                         "or an optimizer statistic that overflowed (a second moment, a Shampoo statistic), "
                         "reached what the step committed")
        self.help = ("lower the learning rate, check the data and the loss for divisions by zero or "
                     "logs of zero, or use fp32/bf16 instead of fp16; resume from the last checkpoint")


class GradNorms:
    """Gradient 2-norms sampled on the steps that end a log interval (the loop sets
    :attr:`sampling`), kept on the device and read at the log boundary (:meth:`read`).
    Not part of the finiteness check: an fp16 step whose gradients overflow is the loss
    scaler's to skip, and its norm is just logged as ``null``."""

    def __init__(self):
        self.sampling = False
        self._kept: dict[tuple[str, str], Tensor] = {}

    def watcher(self, problem: str, what: str = "grad_norm") -> Callable[[Sequence[Tensor]], None]:
        """``keep(grads)``: while :attr:`sampling` is set, queue the 2-norm of ``grads`` (all
        of them as one vector, ``‖(‖g₁‖₂, …, ‖gₙ‖₂)‖₂``: one foreach kernel and one norm) as
        ``(problem, what)``'s latest; a no-op otherwise."""
        key = (problem, what)

        def keep(grads: Sequence[Tensor]) -> None:
            if not self.sampling:
                return
            ts = [g for g in grads if g is not None and _inexact(g)]
            if ts:
                with torch.no_grad():
                    try:
                        each = torch._foreach_norm(ts)
                    except RuntimeError:                    # mixed devices or dtypes
                        each = [torch.linalg.vector_norm(g) for g in ts]
                    self._kept[key] = torch.linalg.vector_norm(torch.stack([n.to(each[0]) for n in each]))
        return keep

    def read(self) -> dict[tuple[str, str], float | None]:
        """``{(problem, what): norm}`` sampled since the last read (one transfer; NaN/Inf as
        None), and forget them."""
        kept, self._kept = self._kept, {}
        if not kept:
            return {}
        try:
            read = torch.stack([v.to(torch.float64) for v in kept.values()]).tolist()
        except RuntimeError:                            # several devices
            read = [float(v) for v in kept.values()]
        return {key: (x if math.isfinite(x) else None) for key, x in zip(kept, read)}


class FiniteGuard:
    """Keeps, on the device, one 0-dim value per watch; :meth:`check` finds the first
    ``(step, problem, what)`` whose tensors were not finite and raises it (see the module
    docstring and :meth:`watch`)."""

    CAPACITY = 4096     # watches kept between two checks before a fold (see _fold)

    def __init__(self, capacity: int | None = None):
        self._capacity = capacity or self.CAPACITY
        self._keys: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._values: list[Tensor] = []          # kept 0-dim tensors (losses, norms), in order
        # one per watch, in order: (step, code, is a flag, index in the flags or the values)
        self._records: list[tuple[int | Tensor, int, bool, int]] = []
        self._first: tuple[int, int] | None = None  # found by a fold, not yet raised
        self._flags: Tensor | None = None        # the flag pool: `capacity` zeros on one device
        self._views: tuple[Tensor, ...] = ()     # its entries, as 0-dim views made once
        self._used = 0                           # flags handed out since the last scan
        self._one: Tensor | None = None
        self._sums: dict[int, list] = {}         # code -> [sum, count] of the finite 0-dim values read
        self.norms = GradNorms()                 # sampled on logged steps; not part of the check

    def watch(self, step: int | Tensor, problem: str, tensors: Tensor | Sequence[Tensor | None],
              what: str = "loss") -> None:
        """Note whether ``tensors`` (a loss, or a problem's gradients; ``None`` entries are
        skipped) are all finite at ``step`` (an int, or a 0-dim integer tensor on the device
        or the CPU). Queues device work only: no ``.item()``, no host sync.

        One 0-dim value is kept on the device per watch:

        - a 0-dim loss is kept as it is (no kernel); a loss that was modified or is a view
          is copied first (its value now); a larger loss is reduced to its largest absolute
          entry (NaN propagates through it, and a maximum of finite numbers cannot
          overflow). The watch failed when that value is not finite.
        - a problem's gradients go through one fused kernel,
          ``torch._amp_foreach_non_finite_check_and_unscale_`` (the check a GradScaler
          runs), with unscale factor exactly 1, so no gradient changes; it sets a flag to 1
          when any entry is NaN or Inf. The flags are the entries of one zeroed tensor made
          once (as views), so a watch allocates nothing and runs that one kernel. Lists the
          kernel does not take (``None`` entries, integer tensors, tensors on another
          device than the pool's) fall back to one largest absolute entry per tensor, as
          for losses.

        Every operation a watch adds to a training step is one whose code a step otherwise
        does not run, so it runs cold (its instructions are not in the CPU's caches): on
        the CPU such a kernel costs ~10 µs inside a step against ~2 µs in a tight loop,
        which is why a watch runs at most one.
        """
        if len(self._records) >= self._capacity:
            self._fold()
        code = self._code(problem, what)
        if isinstance(step, Tensor):
            step = step.detach().clone()        # its value now, as the device sees it
        if isinstance(tensors, Tensor):
            value = tensors
            if value.dim():
                if not _inexact(value):
                    return
                value = torch.linalg.vector_norm(value, math.inf)
            elif value._version or value._base is not None:
                value = value.clone()        # a tensor that may change later: its value now
            kind = _REDUCED if tensors.dim() else _VALUE
            self._records.append((step, code, kind, len(self._values)))
            self._values.append(value.detach() if value.requires_grad else value)
            return
        index = self._flag(tensors)
        if index is not None:
            self._records.append((step, code, _FLAG, index))
            return
        ts = [t for t in tensors if t is not None and _inexact(t)]
        if ts:   # one record per tensor: the first failure is still this watch
            for t in ts:
                self._records.append((step, code, _REDUCED, len(self._values)))
                self._values.append(torch.linalg.vector_norm(t, math.inf))

    def _code(self, problem: str, what: str) -> int:
        """The small integer a record stores for ``(problem, what)``."""
        code = self._keys.get((problem, what))
        if code is None:
            code = self._keys[(problem, what)] = len(self._names)
            self._names.append((problem, what))
        return code

    def loss_watcher(self, problem: str, what: str = "loss") -> Callable[[int, Tensor], None]:
        """``watch(step, problem, loss, what)`` for a training loop's own losses, bound once:
        ``loss`` must be a 0-dim tensor that does not require grad and is never modified
        afterwards (a freshly detached loss), which is then kept as it is. Anything else
        goes through :meth:`watch`."""
        code = self._code(problem, what)

        def keep(step: int, loss: Tensor) -> None:
            if loss.dim() or loss.requires_grad or loss._version or type(step) is not int:
                return self.watch(step, problem, loss, what)
            records, values = self._records, self._values
            if len(records) >= self._capacity:
                return self.watch(step, problem, loss, what)      # folds first
            records.append((step, code, _VALUE, len(values)))
            values.append(loss)
        return keep

    def grads_watcher(self, problem: str, what: str = "gradient") -> Callable[[int, Sequence[Tensor]], None]:
        """``watch(step, problem, grads, what)`` for a problem's gradients, bound once: the
        fused check into the next pool flag with no other work when it applies (an int
        step, a flag left in the pool), else :meth:`watch`."""
        code = self._code(problem, what)
        check = torch._amp_foreach_non_finite_check_and_unscale_

        def keep(step: int, grads: Sequence[Tensor]) -> None:
            records, index = self._records, self._used
            if self._flags is None or len(records) >= self._capacity or type(step) is not int:
                return self.watch(step, problem, grads, what)
            try:
                check(grads, self._views[index], self._one)
            except (TypeError, RuntimeError):       # let watch sort it out
                self._views[index].zero_()
                return self.watch(step, problem, grads, what)
            self._used = index + 1
            records.append((step, code, _FLAG, index))
        return keep

    def _flag(self, tensors: Sequence[Tensor | None]) -> int | None:
        """The index of the next pool flag, set to 1 if any entry of ``tensors`` is NaN or
        Inf (one fused kernel); ``None`` when the kernel does not take ``tensors``."""
        if not tensors or tensors[0] is None:
            return None
        if self._flags is None:
            device = tensors[0].device
            self._flags = torch.zeros(self._capacity, device=device)
            self._views = self._flags.unbind()
            self._one = torch.ones((), device=device)
        elif tensors[0].device != self._flags.device:
            return None
        index = self._used
        flag = self._views[index]
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, flag, self._one)
        except (TypeError, RuntimeError):   # None entries, integer tensors, several devices
            flag.zero_()                     # it may have been set before the kernel gave up
            return None
        self._used = index + 1
        return index

    def _scan(self) -> tuple[int, int] | None:
        """The first kept ``(step, code)`` whose value is not finite (one transfer for the
        values, one for the flags), and forget what was kept."""
        values, records, used = self._values, self._records, self._used
        self._values, self._records, self._used = [], [], 0
        if not records:
            return None
        flags = []
        if used:
            pool = self._flags[:used]
            flags = pool.tolist()
            pool.zero_()
        read = []
        if values:
            try:
                read = torch.stack(values).tolist()        # promotes to the widest dtype
            except RuntimeError:                            # values on several devices
                read = [v.item() for v in values]
        sums = self._sums
        for step, code, kind, i in records:
            if (flags[i] != 0) if kind == _FLAG else not math.isfinite(read[i]):
                return int(step), code
            if kind == _VALUE:
                total = sums.get(code)
                if total is None:
                    sums[code] = [read[i], 1]
                else:
                    total[0] += read[i]
                    total[1] += 1
        return None

    def _fold(self) -> None:
        """``capacity`` watches without a check: read them now, keep the first failure on
        the host and start over. One host sync per ``capacity`` watches; a training loop
        that checks at its log interval never gets here."""
        found = self._scan()
        if self._first is None:
            self._first = found

    def means(self) -> dict[tuple[str, str], tuple[float, int]]:
        """``{(problem, what): (mean, count)}`` of the 0-dim values (losses) kept since the
        last call and read by a :meth:`check` (or a fold): the running mean over a log
        interval, at no extra host sync. Values still unread are not in it: call
        :meth:`check` first."""
        sums, self._sums = self._sums, {}
        return {self._names[code]: (total / count, count) for code, (total, count) in sums.items()}

    def check(self) -> None:
        """Raise :class:`NonFiniteError` for the first non-finite watch, if any (one sync)."""
        if self._first is None:
            self._first = self._scan()
        if self._first is not None:
            step, code = self._first
            problem, what = self._names[code]
            raise NonFiniteError(problem, step, what)


def verify_state(step: int, named: dict[str, Sequence[Tensor]], what: str = COMMITTED) -> None:
    """Raise :class:`NonFiniteError` (``held``) for the first problem of ``named`` (problem
    -> tensors) whose floating tensors hold a NaN or Inf: one fused kernel per problem
    into a flag of its own, one read for all. For the state a checkpoint is about to
    hold (a checkpoint synchronises anyway): whatever wrote it, a step's commit, a
    background job or user code, a non-finite state is never written."""
    flags = []
    for tensors in named.values():
        ts = [t for t in tensors if _inexact(t)]
        flag = torch.zeros((), device=ts[0].device) if ts else torch.zeros(())
        try:
            if ts:
                one = torch.ones((), device=flag.device)
                torch._amp_foreach_non_finite_check_and_unscale_(ts, flag, one)
        except (TypeError, RuntimeError):      # several devices or dtypes the kernel refuses
            flag = torch.stack([~torch.isfinite(t).all().cpu() for t in ts]).any().float()
        flags.append(flag.cpu())
    for problem, bad in zip(named, torch.stack(flags).tolist() if flags else ()):
        if bad:
            raise NonFiniteError(problem, step, what, held=True)
