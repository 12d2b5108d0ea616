"""mloc: a compiler for multilevel optimization (MLO) programs."""

__version__ = "0.1.0"
