"""A package outside mloc declaring two built-ins (torch-free, as `mloc check` reads it):

- `plain(step=0.1)`: gradient descent whose step size is called `step`, not `lr`; its
  record's `RATE` says a schedule scales `step`;
- `onestep(scale=1.0)`: a hypergradient method taking ``H⁻¹ ≈ scale·I`` (one mixed
  product, no Hessian-vector product), declared cheaper than every built-in, and with an
  `AutoRank` so that `auto` may choose it.

Copied by tests/test_extension.py into a temporary package `toyplug` (as `builtins.py`).
"""

from dataclasses import dataclass
from typing import ClassVar

from mloc.builtins import AutoRank, Descriptor, MethodCaps, OptimizerCaps, Param, Shape, optimizer, signature
from mloc.shared.hyper import Hyper, hp
from mloc.lang.types import Float

POSITIVE = Float(0, open_lo=True)


@dataclass(frozen=True)
class PlainHyper(Hyper):
    RATE: ClassVar[str] = "step"

    step: float = hp(0.1, "step size")


PLAIN = optimizer(PlainHyper, "plain", "gradient descent, x ← x − step·g",
                  OptimizerCaps(differentiable=True), "toyplug.runtime:plain", step=POSITIVE)


def _onestep_cost(args: dict, s: Shape):
    """One mixed product: about one G; the activations of one forward."""
    return 0.5, (s.act if s.known else None)


ONESTEP = Descriptor(
    signature("onestep", "identity-Hessian hypergradient: q = scale·v, then one mixed product",
              Param("scale", POSITIVE, 1.0)),
    MethodCaps(auto=AutoRank(0, "onestep: one mixed product, the cheapest method that fits")),
    "toyplug.runtime:onestep", _onestep_cost)

DESCRIPTORS = (PLAIN, ONESTEP)
