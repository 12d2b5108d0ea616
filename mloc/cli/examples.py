"""`mloc examples [DIR]`: copy the example programs (`.mlo` files and the Python modules
beside them) to a folder, so that an installed mloc can run them without the source tree.

The examples' home is `programs/` at the top of the repository; the wheel carries a copy
at `mloc/_programs/` (hatch `force-include`, like the grammar). An existing file in DIR
is never overwritten unless `--force` is given.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mloc.cli.output import EXIT_OK, Output, UsageError

HELP = "copy the example programs (.mlo files and their Python modules) to a folder"

_PACKAGE_COPY = Path(__file__).resolve().parents[1] / "_programs"
_SOURCE_TREE = Path(__file__).resolve().parents[2] / "programs"
_SUFFIXES = {".mlo", ".py"}


def examples_dir() -> Path:
    """The example programs this installation carries (the packaged copy wins)."""
    for path in (_PACKAGE_COPY, _SOURCE_TREE):
        if path.is_dir():
            return path
    raise UsageError(f"mloc's example programs are missing: looked in {_PACKAGE_COPY} and {_SOURCE_TREE}",
                     help="reinstall mloc")


def example_files() -> list[Path]:
    """The files `mloc examples` copies: programs and modules, no caches or run folders."""
    return sorted(p for p in examples_dir().iterdir() if p.is_file() and p.suffix in _SUFFIXES)


def add_command(command) -> None:
    """Register `examples` on the CLI's subparser factory."""
    p = command("examples", HELP, cmd_examples)
    p.add_argument("dir", nargs="?", default="mloc-examples", metavar="DIR",
                   help="the folder to copy them to (created if missing; default: ./mloc-examples)")
    p.add_argument("--force", action="store_true", help="overwrite files of the same name in DIR")


def cmd_examples(args, out: Output) -> int:
    target = Path(args.dir)
    files = example_files()
    clashes = [f.name for f in files if (target / f.name).exists()]
    if clashes and not args.force:
        raise UsageError(f"{target} already has {', '.join(clashes[:3])}" + (" ..." if len(clashes) > 3 else ""),
                         help="choose another folder, or pass --force to overwrite them")
    try:
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, target / f.name)
    except OSError as e:
        raise UsageError(f"cannot write to {target}: {e.strerror}") from None
    programs = [f.name for f in files if f.suffix == ".mlo"]
    out.err(f"copied {len(programs)} programs and {len(files) - len(programs)} Python modules to {target}")
    out.out("\n".join(str(target / p) for p in programs))
    out.err(f"next: mloc check {target}/*.mlo")
    return EXIT_OK
