"""The built-ins (optimizers, hypergradient methods, schedules), each declared once as a
`Descriptor`: signature, capabilities, cost, runtime factory. Torch-free.

Registries map a name to its descriptor, mloc's own and those other packages declare
(entry points of the group `mloc.builtins`, `mloc.builtins.registry`); `TABLES` maps a
field's table name (as in `mloc.lang.vocabulary.FieldSpec.table`) to its registry.
"""

from mloc.builtins.descriptor import (REQUIRED, AutoRank, Descriptor, MethodCaps, OptimizerCaps, Param,
                                      ScheduleCaps, Shape, Signature, optimizer, signature)
from mloc.builtins.methods import METHODS
from mloc.builtins.optimizers import OPTIMIZERS
from mloc.builtins.registry import GROUP, PluginError, Registry
from mloc.builtins.schedules import SCHEDULES

TABLES: dict[str, Registry] = {"optimizers": OPTIMIZERS, "methods": METHODS, "schedules": SCHEDULES}

__all__ = ["GROUP", "METHODS", "OPTIMIZERS", "REQUIRED", "SCHEDULES", "TABLES", "AutoRank", "Descriptor",
           "MethodCaps", "OptimizerCaps", "Param", "PluginError", "Registry", "ScheduleCaps", "Shape",
           "Signature", "optimizer", "signature"]
