"""Constructs the checker accepts but the runtime cannot execute yet (today: interlocking
chains). `mloc check` reports each as a warning (W103), so a program that checks clean
does not first fail at `mloc run`; the compile pipeline's `support` pass reports the same
constructs as errors (E704) before any code is made. A built-in without a runtime is E704
earlier, at `mloc check`, where its call is resolved."""

from __future__ import annotations

from mloc.diagnostics import Diagnostic
from mloc.ir.graph import ProgramGraph

_WHAT = "interlocking chains are checked but not executed yet"
_WHY = ("`mloc check` and `mloc graph` accept this program; training it arrives with the "
        "interlocking-backpropagation runtime")


def unsupported(g: ProgramGraph) -> list[Diagnostic]:
    """One E704 per construct of `g` that cannot run, at its span."""
    return [Diagnostic("E704", _WHAT, c.span, help=_WHY) for c in g.info.chains]


def cannot_run_yet(g: ProgramGraph) -> list[Diagnostic]:
    """The same constructs as `unsupported`, as W103 warnings for `mloc check`."""
    return [Diagnostic("W103", f"{_WHAT}: `mloc run` and `mloc compile` stop here (E704)", c.span,
                       label="checked, cannot run yet", help=_WHY) for c in g.info.chains]
