"""The built-in learning-rate schedules: one `Descriptor` each (runtime in
`mloc/runtime/schedules.py`, a factory returning `factor(step)`)."""

from __future__ import annotations

from mloc.builtins.descriptor import Descriptor, Param, ScheduleCaps, registry, signature
from mloc.lang.types import Float, Int

GAMMA = Float(0, 1, open_lo=True)

SCHEDULES: dict[str, Descriptor] = registry(
    Descriptor(signature("constant", "the optimizer's learning rate, unchanged"),
               ScheduleCaps(identity=True), "mloc.runtime.schedules:constant"),
    Descriptor(signature("cosine", "cosine decay to min_lr over `total` steps, after a linear warm-up",
                         Param("total", Int(1)), Param("warmup", Int(0), 0),
                         Param("min_lr", Float(0), 0.0)),
               ScheduleCaps(takes_base=True), "mloc.runtime.schedules:cosine"),
    Descriptor(signature("linear", "linear decay to zero over `total` steps, after a linear warm-up",
                         Param("total", Int(1)), Param("warmup", Int(0), 0)),
               ScheduleCaps(), "mloc.runtime.schedules:linear"),
    Descriptor(signature("step", "multiply by gamma every `every` steps",
                         Param("every", Int(1)), Param("gamma", GAMMA, 0.1)),
               ScheduleCaps(), "mloc.runtime.schedules:step_decay"),
    Descriptor(signature("exponential", "multiply by gamma every step", Param("gamma", GAMMA)),
               ScheduleCaps(), "mloc.runtime.schedules:exponential"),
)
