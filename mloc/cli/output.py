"""What every command shares: exit codes, the usage error, and the one writer of output.

Exit codes: 0 ok (warnings allowed), 1 the program has errors, 2 usage or I/O error,
101 internal error (a bug in mloc; MLOC_DEBUG=1 shows the traceback), 141 stdout's reader
went away (as SIGPIPE would end the process).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from mloc.diagnostics import Diagnostic, render
from mloc.env import read_env

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERNAL, EXIT_PIPE = 0, 1, 2, 101, 141


class UsageError(Exception):
    """A wrong argument or an unreadable file: exit code 2."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


def within_limits(**flags) -> None:
    """A `UsageError` for `--steps`, `--after`, `--seed` or `--seeds` (keyword `seeds`: a
    list) outside mloc's bounds (:mod:`mloc.shared.limits`), before anything is compiled."""
    from mloc.shared.limits import flag_error
    for name, value in flags.items():
        for v in value if isinstance(value, list) else [value]:
            err = flag_error(f"--{name}", v)
            if err:
                raise UsageError(err, help="see `mloc explain E305` for mloc's bounds")


_WHAT_TO_DO = {
    errno.ENOTDIR: "a file stands where a folder is needed in that path: choose another path",
    errno.EISDIR: "that path is a folder: name a file in it",
    errno.EEXIST: "a file already stands at that path: choose another path",
    errno.ENOENT: "a folder on that path is missing and cannot be made there: choose another path",
    errno.EACCES: "permission denied there: choose another path or change its permissions",
    errno.EPERM: "permission denied there: choose another path or change its permissions",
    errno.EROFS: "that file system is read-only: choose another path",
    errno.ENOSPC: "the disk is full: free some space or choose another path",
    errno.EDQUOT: "the disk quota is used up: free some space or choose another path",
    errno.EFBIG: "the file is larger than this system allows: free some space or raise the limit",
    errno.ENAMETOOLONG: "use a shorter path",
}


def io_error(err: OSError, path: str | os.PathLike | None = None, verb: str = "write") -> UsageError:
    """mloc's own reading or writing of ``path`` (default: the error's file) failed: the
    environment's fault, not mloc's (exit 2). ``cannot VERB PATH: REASON`` with what to do."""
    path = path if path is not None else err.filename
    reason = err.strerror or str(err)
    where = f" {path}" if path is not None else ""
    help = _WHAT_TO_DO.get(err.errno, "check the path")
    if err.errno == errno.ENOENT and verb != "write":
        help = "check the path"
    return UsageError(f"cannot {verb}{where}: {reason}", help=help)


def make_dirs(path: str | os.PathLike, target: str | os.PathLike | None = None, verb: str = "write") -> None:
    """``mkdir -p path``, else a :class:`UsageError` naming ``target`` (default: ``path``),
    the file to be written there. A file on the way is ``Not a directory`` (``mkdir``
    itself says ``File exists`` when ``path`` is that file)."""
    path = Path(path)
    target = path if target is None else target
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:         # exist_ok=True: `path` itself is a file
        raise io_error(NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), target, verb) from None
    except OSError as e:
        raise io_error(e, target, verb) from None


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
