"""Pure text renderers for diagnostics: full (rustc-style), concise and JSON lines.

    full:     error[E305]: `unroll` must be at least 1
                --> prog.mlo:12:38
                 |
              12 | weight_net -> classifier { unroll = 0 }
                 |                                     ^ must be >= 1
                 |
                 = help: ...
    concise:  prog.mlo:12:38: error[E305]: `unroll` must be at least 1
    json:     {"file": "prog.mlo", "line": 12, "col": 38, ...}
"""

from __future__ import annotations

import json
from typing import Iterable

from mloc.diagnostics.diagnostic import Diagnostic


def _head(d: Diagnostic) -> str:
    return f"{d.severity}[{d.code}]: {d.message}"


def render_concise(d: Diagnostic) -> str:
    where = f"{d.span}: " if d.span else ""
    return where + _head(d)


def _caret_line(line_text: str, col: int, width: int) -> str:
    # keep tabs so the carets line up however the terminal expands them
    pad = "".join("\t" if ch == "\t" else " " for ch in line_text[: col - 1])
    return pad + "^" * max(1, width)


def render_full(d: Diagnostic) -> str:
    out = [_head(d)]
    if d.span is None:
        out += [f"  = help: {d.help}"] if d.help else []
        out += [f"  = note: {n}" for n in d.notes]
        return "\n".join(out)
    src, line, col = d.span.source, d.span.line, d.span.col
    text = src.line_text(line)
    end_line, end_col = d.span.end_line_col
    width = (end_col - col + 1) if end_line == line else len(text) - col + 1
    gutter = " " * len(str(line))
    out.append(f"{gutter}--> {d.span}")
    out.append(f"{gutter} |")
    out.append(f"{line} | {text}".rstrip())
    carets = _caret_line(text, col, width)
    out.append(f"{gutter} | {carets}" + (f" {d.label}" if d.label else ""))
    if d.help or d.notes:
        out.append(f"{gutter} |")
    out += [f"{gutter} = help: {d.help}"] if d.help else []
    out += [f"{gutter} = note: {n}" for n in d.notes]
    return "\n".join(out)


def to_json(d: Diagnostic) -> dict:
    obj: dict = {"severity": d.severity, "code": d.code, "name": d.name, "message": d.message}
    if d.span is not None:
        end_line, end_col = d.span.end_line_col
        obj.update(file=d.span.source.path, line=d.span.line, col=d.span.col,
                   end_line=end_line, end_col=end_col + 1)
    obj.update(label=d.label, help=d.help, notes=list(d.notes))
    return obj


def render_json(d: Diagnostic) -> str:
    return json.dumps(to_json(d), ensure_ascii=False, sort_keys=True)


RENDERERS = {"full": render_full, "concise": render_concise, "json": render_json}


def render(diags: Iterable[Diagnostic], style: str = "full") -> str:
    """Render many diagnostics; full ones are separated by blank lines."""
    fn = RENDERERS[style]
    sep = "\n\n" if style == "full" else "\n"
    return sep.join(fn(d) for d in diags)
