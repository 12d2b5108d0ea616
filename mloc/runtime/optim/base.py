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
moving it to a device, checkpointing and restoring it go through :mod:`mloc.runtime.tree`,
which walks every shape alike.

Training commits one step in place: :meth:`Optimizer.commit` (called without autograd).
Its default is ``params += update(...)``; an optimizer may override it with the same
step written with in-place operations (``torch.optim``'s own formulas), one form for
every device. ``diag`` is SAMA's preconditioner where the descriptor declares it: the
diagonal of ``-∂update/∂grad`` of the next update (Choe et al., "Making Scalable Meta
Learning Practical", NeurIPS 2023).

Lifecycle: an optimizer with background work (Shampoo's asynchronous matrix roots) is
told when training starts (:meth:`~Optimizer.start`), must bring its state up to date
before a checkpoint reads it (:meth:`~Optimizer.drain`) and releases its workers at the
end of a run or on an error (:meth:`~Optimizer.close`). For the stateless-in-time
optimizers here all three do nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from torch import Tensor

from mloc.runtime import tree
from mloc.runtime.tree import Params


class Optimizer(ABC):
    """A functional optimizer (see the module docstring). ``hyper`` holds the
    hyperparameters it was built with, by name."""

    diag_uses_grad: ClassVar[bool] = True
    """Whether :meth:`diag` reads ``grads`` (SGD's does not, so SAMA skips a gradient)."""

    def __init__(self, **hyper):
        self.hyper = hyper

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

    def committed(self, state: Any) -> tuple[Tensor, ...]:
        """The floating-point tensors of ``state`` that a :meth:`commit` wrote: with the
        parameters, what the commit pipeline checks for NaN/Inf after every step (one fused
        kernel, :mod:`mloc.runtime.commit`). By default every floating tensor of the state
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

    def start(self) -> None:
        """Training begins (start background workers)."""

    def drain(self) -> None:
        """Finish pending background work: the state is complete after this returns."""

    def close(self) -> None:
        """The run ends, normally or not: stop background workers."""


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
