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
    """`kind every interval [= value]` inside a train block."""

    kind: Ident
    interval: Value
    value: Value | None
    span: Span


@dataclass(frozen=True)
class Block:
    entries: tuple[Field | Every, ...]
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
