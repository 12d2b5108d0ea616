"""The language's vocabulary: value types, built-in signatures and the fields of each block.

Pure data with small checkers; no torch, no user code. The checker (`mloc.passes.validate`)
and the docs (`docs/language.md`) read the same tables, so they cannot drift apart.
"""
