"""mloc's version: a leaf that every module naming it imports (the package's `__init__`
re-exports it as `mloc.__version__`)."""

__version__ = "0.1.0"
