"""The `Diagnostic` value and a collector for reporting every independent error in one run."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Iterable

from mloc.diagnostics.codes import lookup
from mloc.source import Span


@dataclass(frozen=True)
class Diagnostic:
    """One message about the user's program.

    `message` is one sentence without a trailing period; `label` is the short text shown
    under the carets; `help` says how to fix it.
    """

    code: str
    message: str
    span: Span | None = None
    label: str | None = None
    help: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        lookup(self.code)  # an unregistered code is an mloc bug: fail loudly in tests

    @property
    def severity(self) -> str:
        return lookup(self.code).severity

    @property
    def name(self) -> str:
        return lookup(self.code).name

    def sort_key(self) -> tuple:
        path = self.span.source.path if self.span else ""
        start = self.span.start if self.span else -1
        return (path, start, self.code, self.message)


class DiagnosticError(Exception):
    """Raised to stop a stage that cannot go on; carries what was collected so far."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("; ".join(d.message for d in self.diagnostics))


@dataclass
class Diagnostics:
    """A mutable collector used while one stage runs; deduplicates identical reports."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, span: Span | None = None, *, label: str | None = None,
              help: str | None = None, notes: tuple[str, ...] = ()) -> None:
        diag = Diagnostic(code, message, span, label, help, notes)
        if diag not in self.items:
            self.items.append(diag)

    # warnings use the same call; severity comes from the code
    warn = error

    def extend(self, diags: Iterable[Diagnostic]) -> None:
        for d in diags:
            if d not in self.items:
                self.items.append(d)

    def sorted(self) -> tuple[Diagnostic, ...]:
        return tuple(sorted(self.items, key=Diagnostic.sort_key))


def fold_repeats(diags: Iterable[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per error: those that differ only in where they were reported (the
    same call, raising the same exception with the same frames, from four `data` fields)
    become the first one, with a note naming the other places, in order (the first note: a
    help may point at the last one, the innermost frame)."""
    out: list[Diagnostic] = []
    places: dict[Diagnostic, list[Span]] = {}
    for d in diags:
        key = replace(d, span=None)
        if d.span is not None and key in places:
            places[key].append(d.span)
            continue
        places.setdefault(key, [])
        out.append(d)
    return [replace(d, notes=("the same error also at " + ", ".join(map(str, more)), *d.notes))
            if d.span is not None and (more := places[replace(d, span=None)]) else d for d in out]


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate a misspelt `word` most likely meant, or None when nothing is close."""
    matches = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A `help:` text suggesting the closest candidate, or None when nothing is close."""
    match = closest(word, candidates)
    return f"did you mean `{match}`?" if match else None
