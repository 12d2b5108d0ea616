"""What the compiler checks but cannot yet run: reported as E704 before any code is made."""

from __future__ import annotations

from mloc.diagnostics import Diagnostic
from mloc.ir.graph import ProgramGraph


def unsupported(g: ProgramGraph) -> list[Diagnostic]:
    return [Diagnostic("E704", "interlocking chains are checked but not executed yet", c.span,
                       help="`mloc check` and `mloc graph` accept this program; training it arrives "
                            "with the interlocking-backpropagation runtime")
            for c in g.info.chains]
