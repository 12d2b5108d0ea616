"""The optimizer interface every level's optimizer implements, in the style of optax.

An optimizer is a small object with pure ``init(params) -> state`` and
``update(grads, state, params) -> (updates, state)``; the new parameters are
``params + updates`` (:func:`apply_updates`). Nothing is mutated, so an unrolled loop
(``itd``) differentiates through ``update`` with respect to the parameters, the gradients,
and any hyperparameter given as a tensor (a learning-rate schedule's, a learnable one).
Which optimizers are differentiable this way is declared by their descriptor
(``mloc.builtins``), not here.

The state is any pytree of tensors and plain values (NamedTuples, tuples, lists, dicts;
nested as deep as the optimizer likes: per-block statistics, a step count): cloning it,
moving it to a device, checkpointing and restoring it go through :mod:`mloc.runtime.base.tree`,
which walks every shape alike.

Training commits one step in place: :meth:`Optimizer.commit` (called without autograd).
Its default is ``params += update(...)``; an optimizer whose step is written in the
algebra of :mod:`.ops` runs that one definition in both: ``update`` under the functional
interpreter, ``commit`` under an in-place one (``torch.optim``'s own kernels, one form for
every device). ``diag`` is SAMA's preconditioner where the descriptor declares it: the
diagonal of ``-∂update/∂grad`` of the next update (Choe et al., "Making Scalable Meta
Learning Practical", NeurIPS 2023).

Scheduled hyperparameters: a ``torch.optim.lr_scheduler`` may drive more than the rate
(OneCycleLR and CyclicLR cycle the momentum: ``betas[0]`` of Adam, ``momentum`` of SGD).
:meth:`~Optimizer.schedule_stand_in` is what such a scheduler steps in the optimizer's
place (a ``torch.optim`` optimizer with the same param-group entries, under torch's keys),
and :meth:`~Optimizer.drive` turns the entries it drives into 0-dim tensors the engine
rewrites before each commit, as it rewrites a scheduled rate (:meth:`~Optimizer.scheduled_rate`;
the record's ``SCHEDULABLE`` says which entries the optimizer can take so). Either way the
optimizer's record is replaced by one holding the tensors: nothing relies on the optimizer
keeping a tensor it was given. A tensor hyperparameter takes the functional path.

Lifecycle: an optimizer with background work (Shampoo's asynchronous matrix roots) is
told when training starts (:meth:`~Optimizer.start`), must bring its state up to date
before a checkpoint reads it (:meth:`~Optimizer.drain`) and releases its workers at the
end of a run or on an error (:meth:`~Optimizer.close`). For the stateless-in-time
optimizers here all three do nothing.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from torch import Tensor

from mloc.shared.hyper import Hyper

from mloc.runtime.base import tree
from mloc.runtime.base.tree import Params

if TYPE_CHECKING:
    from mloc.runtime.optim.compiled import CompiledCommit


class Optimizer(ABC):
    """A functional optimizer (see the module docstring). ``hyper`` is its hyperparameter
    record (:mod:`mloc.shared.hyper`), the values it steps with: read it when stepping (a
    scheduled field is replaced by a 0-dim tensor after construction)."""

    diag_uses_grad: ClassVar[bool] = True
    """Whether :meth:`diag` reads ``grads`` (SGD's does not, so SAMA skips a gradient)."""

    inplace: bool = True
    """Whether :meth:`commit` may take its in-place form (every hyperparameter a number)."""

    unfused: ClassVar[str | None] = None
    """Why a compiled step cannot run :meth:`update` inside its graph (None: it can, which
    is the default: the update is pure and differentiable, and a step count in the state is
    lifted into an input, :mod:`mloc.runtime.compiled.fused`). An optimizer with host work
    inside its step says so here, and its commit is compiled apart."""

    apart: ClassVar[str | None] = None
    """Which steps a fused step still commits apart (None: none), where :meth:`host_work`
    can be true: the phrase a step's report and banner show."""

    def host_work(self, state: Any) -> bool:
        """Whether the next step from ``state`` does host work inside its commit (Shampoo's
        root refreshes and installs): a fused step then runs its graph without the update
        and commits after it (the compiled commit), that step only. False by default."""
        return False

    def fused_update(self, grads: Params, state: Any, params: Params) -> tuple[Params, Any]:
        """The update a fused step's graph runs (:mod:`mloc.runtime.compiled.fused`), on a
        step where :meth:`host_work` is false: :meth:`update` by default."""
        return self.update(grads, state, params)

    def __init__(self, hyper: Hyper = Hyper()):
        self.hyper = hyper

    @property
    def rate(self) -> Any:
        """The value of the record's ``RATE`` field now (a number, or the 0-dim tensor a
        schedule rewrites); None for an optimizer without one."""
        name = type(self.hyper).RATE
        return None if name is None else getattr(self.hyper, name)

    @abstractmethod
    def init(self, params: Params) -> Any:
        """The state before the first step (a pytree)."""

    @abstractmethod
    def update(self, grads: Params, state: Any, params: Params) -> tuple[Params, Any]:
        """``(updates, new_state)``, out of place and differentiable."""

    def diag(self, grads: Params | None, state: Any, params: Params) -> tuple:
        """Per tensor, the diagonal of ``-∂update/∂grad`` (a tensor or a number that
        broadcasts) of the next update from ``state``. Only where declared."""
        raise NotImplementedError(f"{type(self).__name__} has no SAMA diagonal")

    @property
    def has_diag(self) -> bool:
        """Whether this optimizer implements :meth:`diag` (SAMA can precondition by it)."""
        return type(self).diag is not Optimizer.diag

    def commit(self, grads: Params, state: Any, params: Params) -> Any:
        """One training step in place (``params`` and, where the optimizer says so, the
        state's tensors are overwritten); returns the new state. Called under
        ``torch.no_grad``."""
        updates, state = self.update(grads, state, params)
        for p, u in zip(params, updates):
            p.add_(u)
        return state

    def compiled_commit(self) -> "CompiledCommit":
        """:meth:`commit` with its tensor work compiled by ``torch.compile`` (Inductor): a
        :class:`~mloc.runtime.optim.compiled.CompiledCommit`, called as ``commit`` is (the
        same signature, results and state layout), which also says how many graphs it
        compiled (``compiles``, ``recompiles``, ``compile_seconds``) and, where it runs
        eagerly, why (``reason``; None while compiled). By default ``commit`` itself is
        compiled, whole; an optimizer overrides this to keep host work out of the compiled
        region (Shampoo's root refreshes) or to refuse (``torch.optim``'s optimizers).
        Build it after the hyperparameters are final (:meth:`scheduled_rate`,
        :meth:`drive`): each call of this method compiles anew."""
        from mloc.runtime.optim.compiled import compile_commit
        return compile_commit(self)

    def committed(self, state: Any) -> tuple[Tensor, ...]:
        """The floating-point tensors of ``state`` that a :meth:`commit` wrote: with the
        parameters, what the commit pipeline checks for NaN/Inf after every step (one fused
        kernel, :mod:`mloc.runtime.grad.commit`). By default every floating tensor of the state
        (found by walking it); an optimizer overrides this to skip the walk, and leaves out
        tensors that background work may still be filling (Shampoo's pending roots: checked
        when installed, and with the whole state before every checkpoint, after
        :meth:`drain`)."""
        return tuple(t for t in tree.tensors(state) if t.is_floating_point() or t.is_complex())

    def report(self, state: Any) -> dict[str, float]:
        """Numbers about the optimizer's own health, read at a log boundary (a host read at
        most) and written into its problem's ``train`` record beside the loss (Shampoo's
        rejected roots); none by default."""
        return {}

    def schedule_stand_in(self, lr: float):
        """What a ``torch.optim.lr_scheduler`` steps in this optimizer's place: a
        ``torch.optim`` optimizer whose only param group holds :attr:`hyper` (its rate
        under torch's key ``lr``, at ``lr``) (:func:`stand_in`)."""
        rate = type(self.hyper).RATE
        return stand_in({("lr" if k == rate else k): (lr if k == rate else v)
                         for k, v in self.hyper.items().items() if k == rate or not isinstance(v, Tensor)})

    def drives(self, key: str) -> bool:
        """Whether :meth:`drive` can take the param-group entry ``key`` (``"*"``: any entry,
        whenever a scheduler changes it): the record's ``SCHEDULABLE``."""
        keys = type(self.hyper).SCHEDULABLE
        return key in keys or "*" in keys

    def scheduled_rate(self, dtype, device) -> Callable[[float], None]:
        """Hold the rate (the record's ``RATE`` field) in a 0-dim tensor of ``dtype`` on
        ``device``, starting at the built value; returns ``set(value)``, which writes one
        step's rate into it. Called once, before :meth:`init`, for a scheduled problem."""
        import torch
        name = type(self.hyper).RATE
        t = torch.tensor(float(getattr(self.hyper, name)), dtype=dtype, device=device)
        self.hyper = replace(self.hyper, **{name: t})
        self.inplace = False
        return t.fill_

    def drive(self, keys, like: Tensor) -> Callable[[dict], None]:
        """Hold the param-group entries ``keys`` (each one :meth:`drives`) in 0-dim tensors
        of ``like``'s dtype and device, starting at the built values (a tuple entry, such as
        ``betas``, a tuple of them); returns ``set(values)``, which writes one step's values
        (``{key: number or tuple}``) into them. Called once, before :meth:`init`: with a
        tensor hyperparameter the optimizer takes its functional path, and one whose value
        was 0 is live (SGD's momentum buffers exist)."""
        import torch
        slots: dict[str, tuple[Tensor, ...]] = {}
        for key in keys:
            value = getattr(self.hyper, key)
            values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            slots[key] = tuple(torch.tensor(float(v), dtype=like.dtype, device=like.device) for v in values)
        self.hyper = replace(self.hyper, **{k: ts if len(ts) > 1 else ts[0] for k, ts in slots.items()})
        self.inplace = False
        self._driven(tuple(keys))

        def set_values(step_values: dict) -> None:
            for key, value in step_values.items():
                for t, v in zip(slots[key], tuple(value) if len(slots[key]) > 1 else (value,)):
                    t.fill_(v)
        return set_values

    def _driven(self, keys: tuple[str, ...]) -> None:
        """What follows from ``keys`` being tensors now (SGD: momentum is on)."""

    def start(self) -> None:
        """Training begins (start background workers)."""

    def drain(self) -> None:
        """Finish pending background work: the state is complete after this returns."""

    def close(self) -> None:
        """The run ends, normally or not: stop background workers."""


def stand_in(group: dict):
    """A ``torch.optim.Optimizer`` over one dummy tensor whose ``defaults`` and only param
    group are ``group`` (an mloc optimizer's hyperparameters under torch's keys, as
    :meth:`Optimizer.schedule_stand_in` gives them), and whose ``step`` does nothing: what
    a scheduler reads (``"betas" in optimizer.defaults`` picks what OneCycleLR cycles) is
    what the real optimizer has."""
    import torch

    class StandIn(torch.optim.Optimizer):
        def step(self, closure=None):       # noqa: ARG002 - nothing to update
            return None

    return StandIn([torch.zeros(1, requires_grad=True)], dict(group))


def per_parameter(state: Any, n: int) -> tuple[str, ...]:
    """The fields of ``state`` that hold one entry per parameter: every optimizer's state is
    a NamedTuple whose per-parameter fields are tuples aligned with the parameters (a
    momentum buffer each, Adam's moments, ``torch.optim``'s dict each); the others are
    counts or ``()``."""
    fields = getattr(state, "_fields", ())
    return tuple(f for f in fields if isinstance(getattr(state, f), (tuple, list)) and len(getattr(state, f)) == n)


def keep_absent(new: Any, old: Any, absent: Sequence[int], n: int) -> Any:
    """``new`` (a state after a step) with the per-parameter entries at ``absent`` taken
    from ``old``, out of place (the unrolled steps of ``itd``)."""
    if not absent:
        return new
    changes = {}
    for f in per_parameter(new, n):
        if len(getattr(old, f, ())) != n:
            continue
        entries = list(getattr(new, f))
        for i in absent:
            entries[i] = getattr(old, f)[i]
        changes[f] = type(getattr(new, f))(entries)
    return new._replace(**changes) if changes else new


def commit_present(optimizer: "Optimizer", grads: Params, state: Any, params: Params,
                   absent: Sequence[int], commit: Callable | None = None) -> Any:
    """``optimizer.commit(grads, state, params)`` (or ``commit(...)``: the optimizer's
    :meth:`~Optimizer.compiled_commit`), except that the parameters at ``absent``
    (no gradient reached them: their ``grads`` are zeros) end as they were, with their
    per-parameter state (:func:`per_parameter`): what ``torch.optim`` does for a parameter
    whose ``.grad`` is None (no weight decay, no momentum, no state update). Called under
    ``torch.no_grad``; what it costs is one copy of those parameters and entries."""
    commit = optimizer.commit if commit is None else commit
    if not absent:
        return commit(grads, state, params)
    n = len(params)
    kept = [params[i].clone() for i in absent]
    fields = per_parameter(state, n)
    saved = {f: [tree.clone(getattr(state, f)[i]) for i in absent] for f in fields}
    new = commit(grads, state, params)
    for i, t in zip(absent, kept):
        params[i].copy_(t)
    changes = {}
    for f in per_parameter(new, n):
        if f not in saved:
            continue
        entries = list(getattr(new, f))
        for i, old in zip(absent, saved[f]):
            entries[i] = _restored(entries[i], old)
        changes[f] = type(getattr(new, f))(entries)
    return new._replace(**changes) if changes else new


def _restored(entry: Any, saved: Any) -> Any:
    """``entry`` with ``saved``'s values: copied into its tensors where the structure is
    the same (so whatever holds them, a ``torch.optim`` optimizer, sees them), else
    ``saved`` itself."""
    now, then = tree.tensors(entry), tree.tensors(saved)
    if len(now) == len(then) and all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(now, then)):
        for a, b in zip(now, then):
            a.copy_(b)
        return entry
    return saved


def takes(record: type) -> Callable:
    """Decorate ``f(hyper) -> Optimizer`` into the runtime factory a descriptor names: called
    with the fields of ``record`` (positionally or by name, the record's defaults), with the
    record's signature (what the registry tests compare with the descriptor's)."""
    def wrap(f: Callable) -> Callable:
        @functools.wraps(f)
        def build(*args, **kwargs):
            return f(record(*args, **kwargs))
        build.__signature__ = inspect.signature(record)
        return build
    return wrap


def apply_updates(params: Params, updates: Params) -> Params:
    """``params + updates`` (differentiable, out of place)."""
    return tuple(p + u for p, u in zip(params, updates))


def is_zero(x) -> bool:
    """A hyperparameter that is the number 0 (a tensor never is: it may change)."""
    return not isinstance(x, Tensor) and x == 0


def numbers(*values) -> bool:
    """No tensor among ``values``. The in-place commits take plain numbers only: with a
    tensor hyperparameter ``torch.optim``'s formulas would read it back to the host, so
    those commits take the functional path (:meth:`Optimizer.commit`'s default)."""
    return not any(isinstance(v, Tensor) for v in values)
