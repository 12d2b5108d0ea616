"""The built-in learning-rate schedules: one `Descriptor` each (runtime in
`mloc/runtime/program/schedules.py`, a factory returning `factor(step)`)."""

from __future__ import annotations

from mloc.builtins.descriptor import Descriptor, Param, ScheduleCaps, signature
from mloc.builtins.registry import Registry
from mloc.lang.types import Float, Int, Kwargs, ListOf, Options, Ref

GAMMA = Float(0, 1, open_lo=True)

SCHEDULES: Registry = Registry(ScheduleCaps, 
    Descriptor(signature("constant", "the optimizer's learning rate, unchanged"),
               ScheduleCaps(identity=True), "mloc.runtime.program.schedules:constant"),
    Descriptor(signature("cosine", "cosine decay to min_lr over `total` steps, after a linear warm-up",
                         Param("total", Int(1)), Param("warmup", Int(0), 0),
                         Param("min_lr", Float(0), 0.0)),
               ScheduleCaps(takes_base=True), "mloc.runtime.program.schedules:cosine"),
    Descriptor(signature("linear", "linear decay to zero over `total` steps, after a linear warm-up",
                         Param("total", Int(1)), Param("warmup", Int(0), 0)),
               ScheduleCaps(), "mloc.runtime.program.schedules:linear"),
    Descriptor(signature("step", "multiply by gamma every `every` steps",
                         Param("every", Int(1)), Param("gamma", GAMMA, 0.1)),
               ScheduleCaps(), "mloc.runtime.program.schedules:step_decay"),
    Descriptor(signature("exponential", "multiply by gamma every step", Param("gamma", GAMMA)),
               ScheduleCaps(), "mloc.runtime.program.schedules:exponential"),
    Descriptor(signature("multistep", "multiply by gamma at each milestone (torch's MultiStepLR)",
                         Param("milestones", ListOf(Int(1), min_len=1, increasing=True),
                               doc="the problem's step counts at which to decay, increasing"),
                         Param("gamma", GAMMA, 0.1)),
               ScheduleCaps(), "mloc.runtime.program.schedules:multistep"),
    # Any torch.optim.lr_scheduler class, or a factory `f(optimizer, **options)` returning a
    # scheduler, written as its name's call: `torch.optim.lr_scheduler.StepLR(step_size=10)`.
    # Without a class (`schedule = torch`) the rate stays constant.
    Descriptor(signature("torch", "any torch.optim.lr_scheduler class (or a factory returning "
                         "one), written as its dotted name's call",
                         Param("cls", Ref("an lr_scheduler class or a factory",
                                   "torch.optim.lr_scheduler.StepLR"), None,
                               doc="the scheduler class or factory"),
                         Param("options", Kwargs(), Options(), doc="its keyword arguments")),
               ScheduleCaps(takes_base=True), "mloc.runtime.program.schedules:torch_schedule"),
)
