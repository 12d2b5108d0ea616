"""The hypergradient runtime: what generated training loops call.

- :mod:`mloc.runtime.optim`: functional, differentiable optimizers.
- :mod:`mloc.runtime.methods`: best-response VJPs, one factory per method.
- :mod:`mloc.runtime.problem`: the problem abstraction (``Problem``).
- :mod:`mloc.runtime.compose`: adjoint accumulation over the DAG (``Hierarchy``, ``Edge``).

This package imports torch; ``mloc/__init__.py`` never imports it. torch 2.13 warns at
import time when NumPy is not installed ("Failed to initialize NumPy"); mloc never uses
NumPy, so that one message is filtered out rather than shown on every run.

Which factory implements which built-in is declared once, by the descriptors of
``mloc.builtins`` (their ``runtime`` paths); the runtime keeps no registry of its own.
"""

import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

from mloc.runtime.compose import Edge, Hierarchy
from mloc.runtime.methods import cg, finite_diff, first_order, itd, neumann, sama
from mloc.runtime.optim import Optimizer, adam, adamw, apply_updates, sgd
from mloc.runtime.problem import LowerOp, Problem

__all__ = [
    "Edge", "Hierarchy", "LowerOp", "Optimizer", "Problem", "adam", "adamw", "apply_updates",
    "cg", "finite_diff", "first_order", "itd", "neumann", "sama", "sgd",
]
