"""What every command shares: exit codes, the usage error, and the one writer of output.

Exit codes: 0 ok (warnings allowed), 1 the program has errors, 2 usage or I/O error,
101 internal error (a bug in mloc; MLOC_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import sys

from mloc.diagnostics import Diagnostic, render
from mloc.env import read_env

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 101


class UsageError(Exception):
    """A wrong argument or an unreadable file: exit code 2."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


class Output:
    """Writes to stdout/stderr, colored through rich only when it is a terminal."""

    def __init__(self, color: str):
        env = read_env()
        tty = sys.stderr.isatty()
        self.color = color == "always" or (color == "auto" and tty and not env.no_color)
        self._console = None

    def _rich(self):
        if self._console is None:
            from rich.console import Console
            self._console = Console(stderr=True, highlight=False, soft_wrap=True, force_terminal=True)
        return self._console

    def out(self, text: str) -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")

    def err(self, text: str) -> None:
        if not self.color:
            sys.stderr.write(text + "\n")
            return
        from rich.text import Text
        t = Text(text)
        t.highlight_regex(r"(?m)^error(\[E\d+\])?:.*$", "bold red")
        t.highlight_regex(r"(?m)^warning(\[W\d+\])?:.*$", "bold yellow")
        t.highlight_regex(r"(?m)^\s*(-->|\d* \|)", "bold blue")
        t.highlight_regex(r"(?m)\^+.*$", "bold red")
        t.highlight_regex(r"(?m)= help:.*$", "cyan")
        self._rich().print(t)


def summary(diags: tuple[Diagnostic, ...]) -> str:
    """`2 errors, 1 warning` (empty when there is nothing)."""
    errors = sum(d.severity == "error" for d in diags)
    warnings = len(diags) - errors
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    parts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    return ", ".join(parts)


def report(out: Output, diags, fmt: str) -> None:
    """Diagnostics to stderr (full or concise) or, as JSON lines, to stdout."""
    if not diags:
        return
    if fmt == "json":
        out.out(render(diags, "json"))
    else:
        out.err(render(diags, fmt) + ("\n" if fmt == "full" else ""))


def printer(args, out: Output):
    """The pipeline observer for `--print-after PASS`: prints that pass's result."""
    wanted = getattr(args, "print_after", None)
    if not wanted:
        return None

    def observe(p, unit):
        if p.name == wanted:
            text = p.dump(unit)
            if text is not None:
                out.out(text)
    return observe


def print_timings(out: Output, unit) -> None:
    """`--time-passes`: one line per pass that ran, to stderr."""
    out.err("\n".join(f"  {name:<10} {sec * 1e3:8.2f} ms" for name, sec in unit.timings))


def add_pass_options(p, passes, note: str = "") -> None:
    """`--print-after PASS` and `--time-passes`, their choices taken from `passes`."""
    names = tuple(x.name for x in passes)
    p.add_argument("--print-after", choices=names, metavar="PASS",
                   help=f"print the program after a pass: {', '.join(names)}{note}")
    p.add_argument("--time-passes", action="store_true", help="print how long each pass took")
