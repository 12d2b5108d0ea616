"""Functional optimizers for the levels of a program: the interface (:mod:`.base`) and
one module per optimizer, each stepping with its hyperparameter record
(:mod:`mloc.shared.hyper`); its factory is ``takes(record)``-decorated. Adding one (in mloc or
in a package of your own): docs/architecture.md, "Adding things". :mod:`.torch_optim`
wraps any ``torch.optim`` optimizer."""

from mloc.runtime.optim.adam import Adam, AdamState, adam, adamw
from mloc.runtime.optim.base import Optimizer, apply_updates, commit_present, keep_absent, takes
from mloc.runtime.optim.sgd import SGD, SGDState, sgd
from mloc.runtime.optim.shampoo import Shampoo, ShampooState, shampoo
from mloc.runtime.optim.torch_optim import TorchOptimizer, TorchState, load_ref, torch_optimizer

__all__ = ["Adam", "AdamState", "Optimizer", "SGD", "SGDState", "Shampoo", "ShampooState",
           "TorchOptimizer", "TorchState", "adam", "adamw", "apply_updates", "commit_present", "keep_absent", "load_ref", "sgd",
           "shampoo", "takes", "torch_optimizer"]
