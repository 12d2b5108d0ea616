"""The commands that read only the `.mlo` file: `check`, `graph` (without `--plan`),
`explain`, `codes`. None of them imports torch or runs the program's code."""

from __future__ import annotations

from pathlib import Path

from mloc.cli.output import EXIT_ERRORS, EXIT_OK, Output, UsageError, print_timings, printer, report, summary
from mloc.diagnostics import CODES


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


def _programs(files: list[str], out: Output) -> list[str]:
    """The `.mlo` files among `files` (a shell glob such as `programs/*` also brings the
    Python modules beside them); the others are skipped with one note. A path named
    alone is checked whatever its suffix: the user asked for it."""
    if len(files) == 1:
        return files
    keep = [f for f in files if f.endswith(".mlo") or Path(f).is_dir()]
    skipped = [f for f in files if f not in keep]
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        out.err(f"note: skipped {len(skipped)} file{'s' * (len(skipped) > 1)} that {'do' if len(skipped) > 1 else 'does'} "
                f"not end in .mlo: {shown}")
    return keep


def cmd_check(args, out: Output) -> int:
    status = EXIT_OK
    files = _programs(args.files, out)
    if not files:
        raise UsageError("none of the files given ends in .mlo", help="pass .mlo programs, e.g. programs/*.mlo")
    for path in files:
        unit = _compile(path, observer=printer(args, out))
        report(out, unit.diagnostics, args.format)
        if args.time_passes:
            print_timings(out, unit)
        if not unit.ok:
            status = EXIT_ERRORS
        if args.format != "json":
            verdict = "ok" if unit.ok else "failed"
            counts = summary(unit.diagnostics)
            out.err(f"{path}: {verdict}" + (f" ({counts})" if counts else ""))
    return status


_IMAGE_SUFFIXES = {".png", ".svg", ".pdf"}
_TEXT_SUFFIXES = {".dot": "dot", ".gv": "dot", ".mmd": "mermaid", ".json": "json", ".txt": "text"}


def cmd_graph(args, out: Output) -> int:
    unit = _compile(args.file)
    report(out, unit.diagnostics, "full")
    if not unit.ok:
        out.err(f"{args.file}: failed ({summary(unit.diagnostics)})")
        return EXIT_ERRORS
    from mloc.ir.printer import FORMATS, with_plan
    labels = None
    if args.plan:   # compiling runs the program's Python; kept out of plain `graph`
        from mloc.cli.train import planned_labels
        labels = planned_labels(args, out)
        if labels is None:
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
                         "codes look like E305 or W101; `mloc codes` lists them")
    from mloc.diagnostics.explain import explain
    out.out(explain(code))
    return EXIT_OK


def cmd_codes(args, out: Output) -> int:
    for c in CODES.values():
        out.out(f"{c.code}  {c.name:<28} {c.summary}")
    return EXIT_OK
