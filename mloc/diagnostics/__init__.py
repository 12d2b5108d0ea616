"""Diagnostics: codes, the Diagnostic value, and text/JSON renderers (no I/O here)."""

from mloc.diagnostics.codes import CODES, Code, lookup
from mloc.diagnostics.diagnostic import (Diagnostic, DiagnosticError, Diagnostics, closest, did_you_mean,
                                         fold_repeats)
from mloc.diagnostics.render import render, render_concise, render_full, render_json

__all__ = [
    "CODES", "Code", "lookup", "Diagnostic", "DiagnosticError", "Diagnostics", "closest", "did_you_mean",
    "fold_repeats",
    "render", "render_concise", "render_full", "render_json",
]
