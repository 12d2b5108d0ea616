"""Source text and spans.

A `Span` is a half-open range of character offsets into one `SourceFile`; line and column
numbers (both 1-based, columns counted in characters) are computed on demand, so spans stay
cheap to create and compare.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    """The text of one `.mlo` file and the offsets at which its lines start."""

    path: str
    text: str
    _line_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = [0] + [i + 1 for i, ch in enumerate(self.text) if ch == "\n"]
        object.__setattr__(self, "_line_starts", tuple(starts))

    @classmethod
    def read(cls, path: str | Path) -> "SourceFile":
        """Read a file as UTF-8 (raises OSError/UnicodeDecodeError for the CLI to report).

        A UTF-8 byte-order mark at the very start (editors on some systems write one) is not
        part of the program and is dropped, as Python's own reader does; one anywhere else is
        a character like any other (E002 outside strings and comments).
        """
        p = Path(path)
        return cls(str(path), p.read_text(encoding="utf-8-sig"))

    @property
    def directory(self) -> Path:
        return Path(self.path).resolve().parent

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def offset_of(self, line: int, col: int) -> int:
        """The character offset of a 1-based (line, column), clamped into the text."""
        line = max(1, min(line, len(self._line_starts)))
        return min(self._line_starts[line - 1] + max(col, 1) - 1, len(self.text))

    def line_text(self, line: int) -> str:
        """The text of a 1-based line, without its newline."""
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    def span(self, start: int, end: int) -> "Span":
        return Span(self, start, end)


@dataclass(frozen=True)
class Span:
    """Characters [start, end) of `source`."""

    source: SourceFile = field(repr=False, compare=False)
    start: int
    end: int

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def col(self) -> int:
        return self.source.line_col(self.start)[1]

    @property
    def end_line_col(self) -> tuple[int, int]:
        return self.source.line_col(max(self.start, self.end - 1))

    @property
    def text(self) -> str:
        return self.source.text[self.start:self.end]

    def to(self, other: "Span") -> "Span":
        """The smallest span covering both."""
        return Span(self.source, min(self.start, other.start), max(self.end, other.end))

    def __str__(self) -> str:
        return f"{self.source.path}:{self.line}:{self.col}"
