"""The hypergradient runtime: what generated training loops call.

Subpackages, bottom to top (a module imports only from its own and those before it,
``tests/test_packaging.py``): ``files`` (a run's options, folder, files and loggers,
torch-free), ``base`` (pytrees, the device, the user's code), ``optim`` (optimizers),
``methods`` (BR-VJP methods), ``grad`` (how a problem's gradient is produced, composed and
committed), ``program`` (a program built and stepped, its state), ``run`` (the training
loop and what it writes), ``processes`` (how a run is started, in one process or several).

- :mod:`mloc.runtime.optim`: functional, differentiable optimizers.
- :mod:`mloc.runtime.methods`: best-response VJPs, one factory per method.
- :mod:`mloc.runtime.grad.problem`: the problem abstraction (``Problem``).
- :mod:`mloc.runtime.grad.compose`: adjoint accumulation over the DAG (``Hierarchy``, ``Edge``).

Importing this package imports neither torch nor anything else: each name below is imported
from its module on first use, so the runtime's torch-free modules (the run's options,
:mod:`mloc.runtime.files.options`, which `mloc`'s parser shows) load without torch; `mloc/__init__.py`
never imports it. torch 2.13 warns at import time when NumPy is not installed ("Failed to
initialize NumPy"); mloc never uses NumPy, so that one message is filtered out here, before
any module of the runtime imports torch, rather than shown on every run.

Which factory implements which built-in is declared once, by the descriptors of
``mloc.builtins`` (their ``runtime`` paths); the runtime keeps no registry of its own.
"""

import importlib
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

_OWN = {"Edge": "grad.compose", "Hierarchy": "grad.compose", "LowerOp": "grad.problem", "Problem": "grad.problem"}
_PACKAGES = ("optim", "methods")
"""The runtime's own types by module; then whatever :mod:`.optim` (every optimizer's factory
and class) and :mod:`.methods` (every method's factory) export: the built-ins are listed
once, by those packages, never here."""


def __getattr__(name: str):
    if name in _OWN:
        return getattr(importlib.import_module(f"mloc.runtime.{_OWN[name]}"), name)
    if name == "__all__":
        return sorted({*_OWN, *(n for home in _PACKAGES for n in _package(home).__all__)})
    for home in _PACKAGES:
        if name in _package(home).__all__:
            return getattr(_package(home), name)
    raise AttributeError(f"module 'mloc.runtime' has no attribute {name!r}")


def _package(home: str):
    return importlib.import_module(f"mloc.runtime.{home}")
