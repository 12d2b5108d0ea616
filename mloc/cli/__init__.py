"""The `mloc` command line: the only package that prints, and the only one that knows rich.

    mloc.cli          the parser and `main` (the console entry point)
    mloc.cli.output   exit codes, UsageError, the writer, diagnostics reports
    mloc.cli.check    check, graph, explain, codes: read the `.mlo` file only (no torch)
    mloc.cli.train    compile, plan, run: run the whole pipeline (torch, user code)
    mloc.cli.hypergrad  hypergrad: the same, then hypergradients at a state (`--after N`)
    mloc.cli.examples   examples: copy the example programs to a folder
    mloc.cli.experiments  plot, runs: read run folders
    mloc.cli.sweep    sweep: run grids of runs, tabulated with mloc.cli.experiments' readers

Exit codes: 0 ok (warnings allowed), 1 the program has errors, 2 usage or I/O error,
101 internal error (a bug in mloc; MLOC_DEBUG=1 shows the traceback), 130 interrupted,
141 stdout closed by its reader (`mloc codes | head -2`; nothing is printed).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from mloc.cli.check import cmd_check, cmd_codes, cmd_explain, cmd_graph
from mloc.cli.experiments import EXAMPLES as _EXPERIMENTS
from mloc.cli.output import (EXIT_ERRORS, EXIT_INTERNAL, EXIT_OK, EXIT_PIPE, EXIT_USAGE, Output, UsageError,
                             add_pass_options, io_error)
from mloc.env import read_env
from mloc.shared.version import __version__
from mloc.shared.warning import shown

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_ERRORS", "EXIT_USAGE", "EXIT_INTERNAL", "EXIT_PIPE"]


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
           "  mloc run programs/data_reweighting.mlo --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 --out runs/mwn\n"
           "      (and --node-rank 1 on the second machine)\n"
           "  mloc run programs/data_reweighting.mlo --resume runs/data_reweighting/latest",
    "hypergrad": "examples:\n  mloc hypergrad programs/hpo.mlo --check\n  mloc hypergrad programs/hpo.mlo --json --dtype float64\n"
                 "  mloc hypergrad programs/hpo.mlo --after 20 --check   (after 20 outer steps of training)",
    "codes": "example:\n  mloc codes | grep interlock",
    "examples": "examples:\n  mloc examples                 (copies them to ./mloc-examples)\n"
                "  mloc examples my-programs && mloc check my-programs/*.mlo",
    **_EXPERIMENTS,
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

    from mloc.passes.pipeline import CHECKS
    p = command("check", "check .mlo files without running anything (no torch, no user code)", cmd_check)
    p.add_argument("files", nargs="+", metavar="FILE", help=".mlo files to check")
    p.add_argument("--format", choices=("full", "concise", "json"), default="full",
                   help="diagnostics: full (source and carets), concise (one line each) or json (one object per line)")
    add_pass_options(p, CHECKS, " (the later passes run user code: `mloc compile --print-after PASS`)")

    p = command("graph", "print or render a program's dependency graph", cmd_graph)
    p.add_argument("file", metavar="FILE", help="the .mlo file")
    p.add_argument("--format", choices=("text", "dot", "mermaid", "json"),
                   help="text format (default: text, or from --output's suffix)")
    p.add_argument("--output", "-o", metavar="PATH",
                   help="write to PATH instead of stdout; .png/.svg/.pdf are rendered with Graphviz")
    p.add_argument("--plan", action="store_true",
                   help="label edges with the planner's method, mode and memory (runs the program's Python)")

    from mloc.cli.hypergrad import add_command as add_hypergrad
    from mloc.cli.train import add_commands
    add_commands(command)
    add_hypergrad(command)
    from mloc.cli.examples import add_command as add_examples
    add_examples(command)
    from mloc.cli.experiments import add_commands as add_experiments
    add_experiments(command)
    from mloc.cli.sweep import add_command as add_sweep
    add_sweep(command)

    p = command("explain", "explain a diagnostic code", cmd_explain)
    p.add_argument("code", metavar="CODE", help="a code such as E305")
    command("codes", "list every diagnostic code", cmd_codes)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _stdout_closed()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.color)
    try:
        with shown(write=out.err):      # mloc's warnings as its other notes (mloc.shared.warning)
            code = args.fn(args, out)
        sys.stdout.flush()              # a reader that went away shows here, not at exit
        return code
    except UsageError as e:
        out.err(f"error: {e}" + (f"\n  = help: {e.help}" if e.help else ""))
        return EXIT_USAGE
    except KeyboardInterrupt:
        out.err("interrupted")
        return 130
    except BrokenPipeError:
        raise
    except OSError as e:                # mloc's own I/O on a path the user gave: their environment
        if e.filename is None and e.errno not in _ENVIRONMENT:
            return _internal(e, out)
        err = io_error(e, verb="use")
        out.err(f"error: {err}\n  = help: {err.help}")
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug in mloc
        return _internal(e, out)


_ENVIRONMENT = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES,
                          errno.EPERM, errno.EMFILE, errno.ENFILE})
"""OSErrors that are the machine's state even when they name no file."""


def _internal(e: Exception, out: Output) -> int:
    if read_env().debug:
        raise e
    out.err(f"error[E900]: internal compiler error: {type(e).__name__}: {e}\n"
            "  = note: this is a bug in mloc, not in your program; please report it with the file\n"
            "  = help: set MLOC_DEBUG=1 to see the traceback")
    return EXIT_INTERNAL


def _stdout_closed() -> int:
    """The reader of stdout went away (`mloc codes | head -2`): stop without a word, with the
    status of a program ended by SIGPIPE (128 + 13 = 141, as `cat`, `yes` or `git log` end
    there; 130 after Ctrl-C is the same rule). stdout now points at /dev/null, so Python's
    flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE
