"""mloc: a compiler for multilevel optimization (MLO) programs.

`mloc.load(path)` compiles and instantiates a program (see `mloc.api`); importing `mloc`
itself imports neither torch nor the compiler.
"""

from mloc.shared.version import __version__

__all__ = ["__version__", "load"]


def load(path, **kwargs):
    """Compile and instantiate a `.mlo` program: see `mloc.api.load`."""
    from mloc.api import load as _load
    return _load(path, **kwargs)
