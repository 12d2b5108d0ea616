"""Load the lark grammar once.

The grammar's source of truth is `grammar/mloc.lark` at the top of the repository; the
wheel carries a copy at `mloc/_grammar/mloc.lark` so an installed mloc parses without the
source tree.
"""

from __future__ import annotations

import functools
from pathlib import Path

import lark

_PACKAGE_COPY = Path(__file__).resolve().parent.parent / "_grammar" / "mloc.lark"
_SOURCE_TREE = Path(__file__).resolve().parents[2] / "grammar" / "mloc.lark"


def grammar_path() -> Path:
    """The grammar file this installation uses (the packaged copy wins)."""
    for path in (_PACKAGE_COPY, _SOURCE_TREE):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"mloc's grammar is missing: looked for {_PACKAGE_COPY} and {_SOURCE_TREE}; reinstall mloc")


@functools.lru_cache(maxsize=1)
def parser() -> lark.Lark:
    """The LALR parser with positions; built once per process.

    lark caches the built tables in the temporary directory, keyed by a hash of the grammar
    and options, which takes ~30 ms off every cold `mloc check`; an unwritable cache falls
    back to building the tables."""
    text = grammar_path().read_text(encoding="utf-8")
    options = dict(parser="lalr", propagate_positions=True, maybe_placeholders=True)
    try:
        return lark.Lark(text, cache=True, **options)
    except OSError:
        return lark.Lark(text, **options)
