"""The built-ins (optimizers, hypergradient methods, schedules), each declared once as a
`Descriptor`: signature, capabilities, cost, runtime factory. Torch-free.

Registries map a name to its descriptor; `TABLES` maps a field's table name (as in
`mloc.lang.vocabulary.FieldSpec.table`) to its registry.
"""

from mloc.builtins.descriptor import (REQUIRED, Descriptor, MethodCaps, OptimizerCaps, Param,
                                      ScheduleCaps, Shape, Signature)
from mloc.builtins.methods import METHODS
from mloc.builtins.optimizers import OPTIMIZERS
from mloc.builtins.schedules import SCHEDULES

TABLES: dict[str, dict[str, Descriptor]] = {"optimizers": OPTIMIZERS, "methods": METHODS,
                                            "schedules": SCHEDULES}

__all__ = ["METHODS", "OPTIMIZERS", "REQUIRED", "SCHEDULES", "TABLES", "Descriptor",
           "MethodCaps", "OptimizerCaps", "Param", "ScheduleCaps", "Shape", "Signature"]
