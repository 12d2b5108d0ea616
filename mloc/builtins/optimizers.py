"""The built-in optimizers: one `Descriptor` each (signature, capabilities, runtime factory).

Adding one: its descriptor here, its `Optimizer` in `mloc/runtime/optim/` (named by
`runtime`), its row in `docs/language.md`; the registry-parametrized tests cover the rest.
"""

from __future__ import annotations

from mloc.builtins.descriptor import Descriptor, OptimizerCaps, Param, registry, signature
from mloc.lang.types import Bool, Enum, Float, Int, Kwargs, Options, PyRef, Ref, TupleOf

LR = Float(0, open_lo=True)
UNIT = Float(0, 1, open_hi=True)
BETAS = TupleOf((UNIT, UNIT))
WD = Float(0)
EPS = Float(0, open_lo=True)

SGD = Descriptor(
    signature("sgd", "stochastic gradient descent with optional (Nesterov) momentum",
              Param("lr", LR, doc="learning rate"), Param("momentum", UNIT, 0.0),
              Param("nesterov", Bool(), False), Param("weight_decay", WD, 0.0),
              Param("dampening", Float(0, 1), 0.0)),
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=1),   # momentum buffer
    "mloc.runtime.optim:sgd")

ADAM = Descriptor(
    signature("adam", "Adam (Kingma & Ba, 2015), L2 weight decay added to the gradient",
              Param("lr", LR, 1e-3), Param("betas", BETAS, (0.9, 0.999)),
              Param("eps", EPS, 1e-8), Param("weight_decay", WD, 0.0)),
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=2),   # first, second moment
    "mloc.runtime.optim:adam")

ADAMW = Descriptor(
    signature("adamw", "AdamW (Loshchilov & Hutter, 2019), decoupled weight decay",
              Param("lr", LR, 1e-3), Param("betas", BETAS, (0.9, 0.999)),
              Param("eps", EPS, 1e-8), Param("weight_decay", WD, 1e-2)),
    OptimizerCaps(differentiable=True, sama_diag=True, task_vmap=True, state_per_param=2),
    "mloc.runtime.optim:adamw")

# Differentiable with the roots held constant between refreshes (itd unrolls through
# Q1·G·Q2, the grafting and momentum); a SAMA diagonal: eta·c·sigma·(diag Q1 ⊗ diag Q2),
# exact for graft="none" (docs/shampoo.md). State per parameter (with square blocks): the
# two Kronecker factors and their roots (4), momentum and the grafting accumulator.
SHAMPOO = Descriptor(
    signature("shampoo", "Shampoo (Gupta et al. 2018; Anil et al. 2020): Kronecker-factored "
              "preconditioning with matrix inverse roots, grafting and blocking",
              Param("lr", LR, 1e-3), Param("beta2", Float(0, 1, open_lo=True), 1.0),
              Param("momentum", UNIT, 0.9), Param("nesterov", Bool(), True),
              Param("epsilon", EPS, 1e-6, doc="relative ridge: epsilon·λmax"),
              Param("weight_decay", WD, 0.0), Param("decoupled_weight_decay", Bool(), True),
              Param("update_every", Int(1), 1, doc="steps between root refreshes"),
              Param("start_preconditioning_step", Int(0), 5),
              Param("block_size", Int(1), 128),
              Param("graft", Enum(("adagrad", "sgd", "rmsprop", "adam", "none")), "adagrad"),
              Param("staleness", Int(0), 0, doc="roots from step t are used from step t+staleness"),
              Param("async_roots", Bool(), False, doc="compute the roots in the background (a worker process on the CPU)"),
              Param("exponent_override", Int(0), 0, doc="root order p (0: 2 × the tensor's dims)"),
              Param("max_precond_dim", Int(1), 8192,
                    doc="tensors with a dim above it get the grafted diagonal update"),
              Param("root_method", Enum(("auto", "newton", "eigh")), "auto",
                    doc="inverse roots: coupled Newton, an eigendecomposition, or auto "
                        "(eigh on the CPU, newton on an accelerator)"),
              Param("graft_beta2", UNIT, 0.999, doc="second-moment decay of rmsprop/adam grafting")),
    OptimizerCaps(differentiable=True, sama_diag=True, state_per_param=6),
    "mloc.runtime.optim:shampoo")

# Any torch.optim optimizer, or a factory `f(params, lr=..., **options)` returning one,
# written as its name's call: `torch.optim.RAdam(lr=1e-3, betas=(0.9, 0.99))`. It steps the
# parameters in place, outside autograd: no method may look inside its update. State per
# parameter: at most three tensors for torch.optim's own (Adam with amsgrad).
TORCH = Descriptor(
    signature("torch", "any torch.optim optimizer (or a factory returning one), written as "
              "its dotted name's call, e.g. `torch.optim.RAdam(lr=1e-3)`",
              Param("lr", LR, doc="learning rate (a schedule's base)"),
              Param("cls", Ref("a torch.optim optimizer class or a factory", "torch.optim.RAdam"),
                    PyRef("torch.optim:SGD"), doc="the class or factory (default torch.optim.SGD)"),
              Param("options", Kwargs(), Options(), doc="its other keyword arguments")),
    OptimizerCaps(differentiable=False, sama_diag=False, state_per_param=3,
                  opaque="a `torch.optim` optimizer updates the parameters in place, outside "
                  "autograd, and mloc knows no derivative of its update"),
    "mloc.runtime.optim:torch_optimizer")

OPTIMIZERS: dict[str, Descriptor] = registry(SGD, ADAM, ADAMW, SHAMPOO, TORCH)
