"""The frozen syntax tree of a `.mlo` file. Every node keeps the span it was parsed from.

Values are the small literal language of call arguments: numbers, strings, booleans,
dotted names, calls, lists and tuples. Nothing here knows what a name means; name
resolution and checking happen in `mloc.passes.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from mloc.source import Span


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span


@dataclass(frozen=True)
class Name:
    """A dotted name such as `lib.MLP`, `batch`, `bf16` or a problem's name."""

    parts: tuple[str, ...]
    span: Span

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True)
class Number:
    value: int | float
    text: str
    span: Span


@dataclass(frozen=True)
class String:
    value: str
    span: Span


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span


@dataclass(frozen=True)
class ListValue:
    items: tuple["Value", ...]
    span: Span


@dataclass(frozen=True)
class TupleValue:
    items: tuple["Value", ...]
    span: Span


@dataclass(frozen=True)
class Arg:
    """One call argument; `keyword` is None for a positional one."""

    keyword: Ident | None
    value: "Value"
    span: Span


@dataclass(frozen=True)
class Call:
    func: Name
    args: tuple[Arg, ...]
    span: Span


Value = Union[Name, Number, String, Bool, ListValue, TupleValue, Call]


@dataclass(frozen=True)
class Field:
    """`key = value` inside a block."""

    key: Ident
    value: Value
    span: Span


@dataclass(frozen=True)
class Every:
    """`kind [name] every interval [= value]` inside a train block
    (`eval acc every 500 = lib.accuracy(...)`: `name` is `acc`)."""

    kind: Ident
    interval: Value
    value: Value | None
    span: Span
    name: Ident | None = None


@dataclass(frozen=True)
class Watch:
    """`kind what on [mode] metric` inside a train block: `checkpoint best on max acc`."""

    kind: Ident
    what: Ident
    mode: Ident | None
    metric: Name
    span: Span


@dataclass(frozen=True)
class Stop:
    """`kind when [mode] metric has not improved [by min_delta] for patience unit` inside a
    train block: `stop when max acc has not improved by 0.001 for 5 evals`."""

    kind: Ident
    mode: Ident | None
    metric: Name
    min_delta: Value | None
    patience: Value
    unit: Ident
    span: Span


Entry = Union[Field, Every, Watch, Stop]


@dataclass(frozen=True)
class Block:
    entries: tuple[Entry, ...]
    span: Span


@dataclass(frozen=True)
class ProgramDecl:
    name: Ident
    span: Span


@dataclass(frozen=True)
class Import:
    module: Name
    alias: Ident | None
    span: Span

    @property
    def bound(self) -> str:
        """The name this import introduces: the alias, or the dotted module path."""
        return self.alias.name if self.alias else self.module.dotted


@dataclass(frozen=True)
class Problem:
    name: Ident
    body: Block
    span: Span


@dataclass(frozen=True)
class Edge:
    """`a -> b -> c { ... }`: each consecutive pair is one hierarchy edge (upper -> lower)."""

    path: tuple[Ident, ...]
    body: Block | None
    span: Span


@dataclass(frozen=True)
class Chain:
    """`chain [s1, s2, ...] { interlock = n }`: depthwise stages trained by interlocking backprop."""

    stages: tuple[Ident, ...]
    body: Block | None
    span: Span


@dataclass(frozen=True)
class Train:
    body: Block
    span: Span


@dataclass(frozen=True)
class Setting:
    """A program-level `key = value`, e.g. `semantics = exact`."""

    key: Ident
    value: Value
    span: Span


Item = Union[ProgramDecl, Import, Problem, Edge, Chain, Train, Setting]


@dataclass(frozen=True)
class Module:
    """One parsed file."""

    items: tuple[Item, ...]
    span: Span

    def of_type(self, cls: type) -> tuple:
        return tuple(i for i in self.items if isinstance(i, cls))
