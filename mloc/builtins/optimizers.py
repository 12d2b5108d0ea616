"""The built-in optimizers: one `Descriptor` each, its signature read from the optimizer's
hyperparameter record (`mloc.shared.hyper`), with its capabilities and runtime factory.

Adding one (here or in a package of your own, docs/architecture.md "Adding things"): its
record, its descriptor (`optimizer(record, ...)`), its `Optimizer` (named by `runtime`).
"""

from __future__ import annotations

from mloc.builtins.descriptor import OptimizerCaps, Param, optimizer
from mloc.builtins.registry import Registry
from mloc.shared.hyper import (GRAFTS, ROOT_ALGORITHMS, AdamHyper, AdamWHyper, SGDHyper, ShampooHyper,
                             TorchHyper)
from mloc.lang.types import Bool, Enum, Float, Int, Kwargs, Options, PyRef, Ref, TupleOf

LR = Float(0, open_lo=True)
UNIT = Float(0, 1, open_hi=True)
BETAS = TupleOf((UNIT, UNIT))
WD = Float(0)
EPS = Float(0, open_lo=True)

SGD = optimizer(
    SGDHyper, "sgd", "stochastic gradient descent with optional (Nesterov) momentum",
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=1),   # momentum buffer
    "mloc.runtime.optim:sgd",
    lr=LR, momentum=UNIT, nesterov=Bool(), weight_decay=WD, dampening=Float(0, 1))

_ADAM_TYPES = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

ADAM = optimizer(
    AdamHyper, "adam", "Adam (Kingma & Ba, 2015), L2 weight decay added to the gradient",
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=2, diag_reads_grad=True),   # first, second moment
    "mloc.runtime.optim:adam", **_ADAM_TYPES)

ADAMW = optimizer(
    AdamWHyper, "adamw", "AdamW (Loshchilov & Hutter, 2019), decoupled weight decay",
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=2, diag_reads_grad=True),
    "mloc.runtime.optim:adamw", **_ADAM_TYPES)

# Differentiable with the roots held constant between refreshes (itd unrolls through
# Q1·G·Q2, the grafting and momentum); a SAMA diagonal: eta·c·sigma·(diag Q1 ⊗ diag Q2),
# exact for graft="none" (docs/shampoo.md). State per parameter (with square blocks): the
# two Kronecker factors and their roots (4), momentum and the grafting accumulator.
SHAMPOO = optimizer(
    ShampooHyper, "shampoo", "Shampoo (Gupta et al. 2018; Anil et al. 2020): Kronecker-factored "
    "preconditioning with matrix inverse roots, grafting and blocking",
    OptimizerCaps(differentiable=True, sama_diag=True, state_per_param=6, diag_reads_grad=True),
    "mloc.runtime.optim:shampoo",
    lr=LR, beta2=Float(0, 1, open_lo=True), momentum=UNIT, nesterov=Bool(), epsilon=EPS,
    weight_decay=WD, decoupled_weight_decay=Bool(), update_every=Int(1),
    start_preconditioning_step=Int(0), block_size=Int(1), graft=Enum(GRAFTS), staleness=Int(0),
    async_roots=Bool(), exponent_override=Int(0), max_precond_dim=Int(1),
    root_method=Enum(("auto", *ROOT_ALGORITHMS)), graft_beta2=UNIT)

# Any torch.optim optimizer, or a factory `f(params, lr=..., **options)` returning one,
# written as its name's call: `torch.optim.RAdam(lr=1e-3, betas=(0.9, 0.99))`. It steps the
# parameters in place, outside autograd: no method may look inside its update. State per
# parameter: at most three tensors for torch.optim's own (Adam with amsgrad).
TORCH = optimizer(
    TorchHyper, "torch", "any torch.optim optimizer (or a factory returning one), written as "
    "its dotted name's call, e.g. `torch.optim.RAdam(lr=1e-3)`",
    OptimizerCaps(differentiable=False, sama_diag=False, state_per_param=3,
                  opaque="a `torch.optim` optimizer updates the parameters in place, outside "
                  "autograd, and mloc knows no derivative of its update"),
    "mloc.runtime.optim:torch_optimizer",
    lr=LR,
    cls=Param("cls", Ref("a torch.optim optimizer class or a factory", "torch.optim.RAdam"),
              PyRef(TorchHyper.cls), doc="the class or factory (default torch.optim.SGD)"),
    options=Param("options", Kwargs(), Options(), doc="its other keyword arguments"))

OPTIMIZERS: Registry = Registry(OptimizerCaps, SGD, ADAM, ADAMW, SHAMPOO, TORCH)
