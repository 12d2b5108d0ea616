"""The `mloc` command line: the only module that prints, and the only one that knows rich.

Exit codes: 0 ok (warnings allowed), 1 the program has errors, 2 usage or I/O error,
101 internal error (a bug in mloc; MLOC_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mloc import __version__
from mloc.diagnostics import CODES, Diagnostic, render
from mloc.env import read_env

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 101


class UsageError(Exception):
    """A wrong argument or an unreadable file: exit code 2."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


# --- output -----------------------------------------------------------------------------

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


def _summary(diags: tuple[Diagnostic, ...]) -> str:
    errors = sum(d.severity == "error" for d in diags)
    warnings = len(diags) - errors
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    parts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    return ", ".join(parts)


def _report(out: Output, diags, fmt: str) -> None:
    if not diags:
        return
    if fmt == "json":
        out.out(render(diags, "json"))
    else:
        out.err(render(diags, fmt) + ("\n" if fmt == "full" else ""))


# --- commands ---------------------------------------------------------------------------

def _compile(path: str, **kw):
    from mloc.passes.pipeline import compile_file  # deferred: keeps `--help` instant
    try:
        return compile_file(path, **kw)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}", help="check the path; programs end in .mlo") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory", help=f"pass the .mlo files in it, e.g. {path}/*.mlo") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def cmd_check(args, out: Output) -> int:
    status = EXIT_OK
    for path in args.files:
        unit = _compile(path, observer=_printer(args, out))
        _report(out, unit.diagnostics, args.format)
        if args.time_passes:
            out.err("\n".join(f"  {name:<10} {sec * 1e3:8.2f} ms" for name, sec in unit.timings))
        if not unit.ok:
            status = EXIT_ERRORS
        if args.format != "json":
            verdict = "ok" if unit.ok else "failed"
            summary = _summary(unit.diagnostics)
            out.err(f"{path}: {verdict}" + (f" ({summary})" if summary else ""))
    return status


def _printer(args, out: Output):
    wanted = getattr(args, "print_after", None)
    if not wanted:
        return None

    def observe(p, unit):
        if p.name != wanted:
            return
        if p.name == "parse" and unit.ast is not None:
            from mloc.frontend.printer import dump_ast
            out.out(dump_ast(unit.ast))
        elif unit.graph is not None and p.name != "resolve":
            from mloc.ir.printer import dump_text
            out.out(dump_text(unit.graph))
        elif unit.resolved is not None:
            out.out("\n".join(f"problem {p.name}" for p in unit.resolved.problems))
    return observe


_IMAGE_SUFFIXES = {".png", ".svg", ".pdf"}
_TEXT_SUFFIXES = {".dot": "dot", ".gv": "dot", ".mmd": "mermaid", ".json": "json", ".txt": "text"}


def cmd_graph(args, out: Output) -> int:
    unit = _compile(args.file)
    _report(out, unit.diagnostics, "full")
    if not unit.ok:
        out.err(f"{args.file}: failed ({_summary(unit.diagnostics)})")
        return EXIT_ERRORS
    from mloc.ir.printer import FORMATS, with_plan
    if args.plan:   # compiling runs the program's Python; kept out of plain `graph`
        from mloc.cli_train import planned_labels
    labels = planned_labels(args, out) if args.plan else None
    if args.plan and labels is None:
        return EXIT_ERRORS
    render_fmt = lambda fmt: with_plan(FORMATS[fmt](unit.graph), fmt, labels) if labels else FORMATS[fmt](unit.graph)  # noqa: E731
    if args.output is None:
        out.out(render_fmt(args.format or "text"))
        return EXIT_OK
    target = Path(args.output)
    suffix = target.suffix.lower()
    if suffix in _IMAGE_SUFFIXES:
        _render_image(render_fmt("dot"), target, suffix[1:])
    else:
        fmt = args.format or _TEXT_SUFFIXES.get(suffix)
        if fmt is None:
            raise UsageError(f"cannot tell the format of {target.name} from its suffix",
                             help="use .png, .svg, .pdf, .dot, .mmd, .json or .txt, or pass --format")
        _write(target, render_fmt(fmt))
    out.err(f"wrote {target}")
    return EXIT_OK


def _write(target: Path, text: str) -> None:
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror}") from None


def _render_image(dot_text: str, target: Path, fmt: str) -> None:
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if dot is None:
        raise UsageError(f"rendering {target.name} needs Graphviz's `dot` program, which is not installed",
                         help="install Graphviz (Debian/Ubuntu: `apt-get install graphviz`; macOS: "
                              "`brew install graphviz`; conda: `conda install graphviz`), or write "
                              f"DOT text instead: `--output {target.with_suffix('.dot').name}`")
    proc = subprocess.run([dot, f"-T{fmt}", "-o", str(target)], input=dot_text, text=True,
                          capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise UsageError(f"Graphviz could not render {target}: {proc.stderr.strip()}")


def cmd_explain(args, out: Output) -> int:
    code = args.code.upper()
    if code not in CODES:
        from mloc.diagnostics import did_you_mean
        raise UsageError(f"no diagnostic code {args.code}", help=did_you_mean(code, CODES) or
                         "codes look like E305 or W101; `mloc explain --list` lists them")
    c = CODES[code]
    out.out(f"{c.code} ({c.name}, {c.severity}): {c.summary}")
    return EXIT_OK


def cmd_codes(args, out: Output) -> int:
    for c in CODES.values():
        out.out(f"{c.code}  {c.name:<28} {c.summary}")
    return EXIT_OK


# --- argument parsing -------------------------------------------------------------------

_EXAMPLES = {
    "check": "examples:\n  mloc check programs/data_reweighting.mlo\n  mloc check programs/*.mlo --format concise",
    "graph": "examples:\n  mloc graph programs/trilevel.mlo\n  mloc graph programs/trilevel.mlo --format mermaid\n"
             "  mloc graph programs/maml.mlo --plan --format dot\n"
             "  mloc graph programs/trilevel.mlo --output trilevel.svg   (needs Graphviz)",
    "explain": "example:\n  mloc explain E305",
    "compile": "examples:\n  mloc compile programs/hpo.mlo -o build/hpo\n  python build/hpo/train.py --steps 10",
    "plan": "examples:\n  mloc plan programs/maml.mlo\n  mloc plan programs/trilevel.mlo --json",
    "run": "examples:\n  mloc run programs/data_reweighting.mlo --steps 200 --out runs/mwn\n"
           "  mloc run programs/data_reweighting.mlo --set 'weight_net->classifier.hypergrad=neumann(iters=3, alpha=0.1)'\n"
           "  mloc run programs/data_reweighting.mlo --nproc 2 --out runs/mwn2\n"
           "  mloc run programs/data_reweighting.mlo --resume runs/mwn --out runs/mwn",
    "hypergrad": "examples:\n  mloc hypergrad programs/hpo.mlo --check\n  mloc hypergrad programs/hpo.mlo --json --dtype float64",
    "codes": "example:\n  mloc codes | grep interlock",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mloc", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="mloc compiles multilevel optimization programs (.mlo files): bilevel and deeper "
                    "training such as meta-learning, data reweighting and hyperparameter optimization.",
        epilog="examples:\n  mloc check programs/*.mlo\n  mloc graph programs/data_reweighting.mlo --format dot\n\n"
               "Run `mloc COMMAND --help` for a command's options.")
    parser.add_argument("--version", action="version", version=f"mloc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, help: str, fn):
        p = sub.add_parser(name, help=help, description=help, epilog=_EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(fn=fn)
        p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                       help="color diagnostics (default: auto, when writing to a terminal)")
        return p

    from mloc.passes.pipeline import PASSES
    pass_names = tuple(PASSES)
    p = command("check", "check .mlo files without running anything (no torch, no user code)", cmd_check)
    p.add_argument("files", nargs="+", metavar="FILE", help=".mlo files to check")
    p.add_argument("--format", choices=("full", "concise", "json"), default="full",
                   help="diagnostics: full (source and carets), concise (one line each) or json (one object per line)")
    p.add_argument("--print-after", choices=pass_names, metavar="PASS",
                   help=f"print the program after a pass: {', '.join(pass_names)}")
    p.add_argument("--time-passes", action="store_true", help="print how long each pass took")

    p = command("graph", "print or render a program's dependency graph", cmd_graph)
    p.add_argument("file", metavar="FILE", help="the .mlo file")
    p.add_argument("--format", choices=("text", "dot", "mermaid", "json"),
                   help="text format (default: text, or from --output's suffix)")
    p.add_argument("--output", "-o", metavar="PATH",
                   help="write to PATH instead of stdout; .png/.svg/.pdf are rendered with Graphviz")
    p.add_argument("--plan", action="store_true",
                   help="label edges with the planner's method, mode and memory (runs the program's Python)")

    from mloc.cli_train import add_commands
    add_commands(command)

    p = command("explain", "explain a diagnostic code", cmd_explain)
    p.add_argument("code", metavar="CODE", help="a code such as E305")
    command("codes", "list every diagnostic code", cmd_codes)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.color)
    try:
        return args.fn(args, out)
    except UsageError as e:
        out.err(f"error: {e}" + (f"\n  = help: {e.help}" if e.help else ""))
        return EXIT_USAGE
    except KeyboardInterrupt:
        out.err("interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug in mloc
        if read_env().debug:
            raise
        out.err(f"error[E900]: internal compiler error: {type(e).__name__}: {e}\n"
                "  = note: this is a bug in mloc, not in your program; please report it with the file\n"
                "  = help: set MLOC_DEBUG=1 to see the traceback")
        return EXIT_INTERNAL
