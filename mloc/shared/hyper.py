"""Each optimizer's hyperparameters, declared once as a frozen record: torch-free, read by
its descriptor (`mloc.builtins.descriptor.optimizer`: the signature's names, order,
defaults and docs, and what a schedule may drive) and by its implementation (the values it
steps with, `Optimizer.hyper`), so neither restates the other.

A record subclasses `Hyper` and names, as class variables,

- `RATE`: the field a schedule scales (the step size; any name): the runtime holds it in a
  0-dim tensor it rewrites before every commit;
- `SCHEDULABLE`: the fields a `torch.optim.lr_scheduler` may drive besides the rate (torch's
  param-group keys: OneCycleLR cycles `momentum`, or `betas` where the group has them).

The optimizer receives a scheduled value the one way every optimizer does: its record is
replaced by one whose driven fields are 0-dim tensors (`Optimizer.drive`), before `init`;
an implementation reads `self.hyper` when it steps and relies on no tensor's identity.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar


def hp(default: Any = MISSING, doc: str = "") -> Any:
    """A record field with a default (none: required) and a one-line doc."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Hyper:
    """The base of every record (see the module docstring)."""

    RATE: ClassVar[str | None] = None
    SCHEDULABLE: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def spec(cls) -> tuple[tuple[str, Any, str], ...]:
        """``(name, default or MISSING, doc)`` per field, in order."""
        return tuple((f.name, f.default, f.metadata.get("doc", "")) for f in fields(cls))

    def items(self) -> dict[str, Any]:
        """The values by name (a shallow dict: tuples and tensors as they are)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SGDHyper(Hyper):
    RATE: ClassVar[str] = "lr"
    SCHEDULABLE: ClassVar[tuple[str, ...]] = ("momentum", "dampening", "weight_decay")

    lr: float = hp(doc="learning rate")
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    dampening: float = 0.0


@dataclass(frozen=True)
class AdamHyper(Hyper):
    RATE: ClassVar[str] = "lr"
    SCHEDULABLE: ClassVar[tuple[str, ...]] = ("betas", "eps", "weight_decay")

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class AdamWHyper(AdamHyper):
    weight_decay: float = 1e-2


GRAFTS = ("adagrad", "sgd", "rmsprop", "adam", "none")
"""Shampoo's grafting kinds (`mloc.runtime.optim.graft`)."""
ROOT_ALGORITHMS = ("newton", "eigh")
"""Shampoo's inverse-root algorithms (`mloc.runtime.optim.roots`); `root_method` also takes "auto"."""


@dataclass(frozen=True)
class ShampooHyper(Hyper):
    RATE: ClassVar[str] = "lr"
    SCHEDULABLE: ClassVar[tuple[str, ...]] = ("momentum", "weight_decay")   # no `betas`

    lr: float = 1e-3
    beta2: float = 1.0
    momentum: float = 0.9
    nesterov: bool = True
    epsilon: float = hp(1e-6, "relative ridge: epsilon·λmax")
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = True
    update_every: int = hp(1, "steps between root refreshes")
    start_preconditioning_step: int = 5
    block_size: int = 128
    graft: str = "adagrad"
    staleness: int = hp(0, "roots from step t are used from step t+staleness")
    async_roots: bool = hp(False, "compute the roots in the background (a worker process on the CPU)")
    exponent_override: int = hp(0, "root order p (0: 2 × the tensor's dims)")
    max_precond_dim: int = hp(8192, "tensors with a dim above it get the grafted diagonal update")
    root_method: str = hp("auto", "inverse roots: coupled Newton, an eigendecomposition, or auto "
                                  "(eigh on the CPU, newton on an accelerator)")
    graft_beta2: float = hp(0.999, "second-moment decay of rmsprop/adam grafting")


@dataclass(frozen=True)
class TorchHyper(Hyper):
    """Any `torch.optim` optimizer: every entry of its param group may be driven (`"*"`)."""

    RATE: ClassVar[str] = "lr"
    SCHEDULABLE: ClassVar[tuple[str, ...]] = ("*",)

    lr: float = hp(doc="learning rate (a schedule's base)")
    cls: Any = "torch.optim:SGD"       # the language's `Ref` and `Kwargs`: their docs are the descriptor's
    options: Any = None
