"""The hypergradient runtime: what generated training loops call.

- :mod:`mloc.runtime.optim`: functional, differentiable optimizers.
- :mod:`mloc.runtime.methods`: best-response VJPs, one factory per method.
- :mod:`mloc.runtime.problem`: the problem abstraction (``Problem``).
- :mod:`mloc.runtime.compose`: adjoint accumulation over the DAG (``Hierarchy``, ``Edge``).

Importing this package imports neither torch nor anything else: each name below is imported
from its module on first use, so the runtime's torch-free modules (the run's options,
:mod:`mloc.runtime.options`, which `mloc`'s parser shows) load without torch; `mloc/__init__.py`
never imports it. torch 2.13 warns at import time when NumPy is not installed ("Failed to
initialize NumPy"); mloc never uses NumPy, so that one message is filtered out here, before
any module of the runtime imports torch, rather than shown on every run.

Which factory implements which built-in is declared once, by the descriptors of
``mloc.builtins`` (their ``runtime`` paths); the runtime keeps no registry of its own.
"""

import importlib
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

_HOMES = {"Edge": "compose", "Hierarchy": "compose", "LowerOp": "problem", "Problem": "problem",
          "Optimizer": "optim", "adam": "optim", "adamw": "optim", "apply_updates": "optim", "sgd": "optim",
          "cg": "methods", "finite_diff": "methods", "first_order": "methods", "itd": "methods",
          "neumann": "methods", "sama": "methods"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'mloc.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mloc.runtime.{home}"), name)
