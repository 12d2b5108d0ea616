"""Functional optimizers for the levels of a program: the interface (:mod:`.base`) and
one module per optimizer. Adding one: a module here with its ``Optimizer`` subclass and
factory, and its descriptor in ``mloc.builtins.optimizers`` (signature, capabilities,
cost, ``runtime="mloc.runtime.optim:<factory>"``). :mod:`.torch_optim` wraps any
``torch.optim`` optimizer."""

from mloc.runtime.optim.adam import Adam, AdamState, adam, adamw
from mloc.runtime.optim.base import Optimizer, apply_updates, commit_present, keep_absent
from mloc.runtime.optim.sgd import SGD, SGDState, sgd
from mloc.runtime.optim.shampoo import Shampoo, ShampooState, shampoo
from mloc.runtime.optim.torch_optim import TorchOptimizer, TorchState, load_ref, torch_optimizer

__all__ = ["Adam", "AdamState", "Optimizer", "SGD", "SGDState", "Shampoo", "ShampooState",
           "TorchOptimizer", "TorchState", "adam", "adamw", "apply_updates", "commit_present", "keep_absent", "load_ref", "sgd",
           "shampoo", "torch_optimizer"]
