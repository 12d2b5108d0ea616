"""The support pass: constructs the checker accepts but the runtime cannot execute yet,
reported as E704 before any code is made (today: interlocking chains). A built-in without
a runtime is E704 earlier, at `mloc check`, where its call is resolved."""

from __future__ import annotations

from mloc.diagnostics import Diagnostic
from mloc.ir.graph import ProgramGraph


def unsupported(g: ProgramGraph) -> list[Diagnostic]:
    """One E704 per construct of `g` that cannot run, at its span."""
    return [Diagnostic("E704", "interlocking chains are checked but not executed yet", c.span,
                       help="`mloc check` and `mloc graph` accept this program; training it arrives "
                            "with the interlocking-backpropagation runtime")
            for c in g.info.chains]
