"""The language's vocabulary: value types and the fields of each block.

Pure data with small checkers; no torch, no user code. The built-ins themselves
(optimizers, methods, schedules) are declared in `mloc.builtins`. The checker and the docs
(`docs/language.md`) read the same tables, so they cannot drift apart.
"""
