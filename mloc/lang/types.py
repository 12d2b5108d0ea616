"""Value types of the language and their checkers.

`check(value, where, diags)` returns the Python value for a well-typed literal, or `INVALID`
after reporting E304 (wrong type) or E305 (out of range, or above mloc's bound on a count:
:mod:`mloc.shared.limits`). `where` is the human name of the
slot being checked, e.g. "`unroll`" or "`lr` of `sgd`".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mloc.diagnostics import Diagnostics
from mloc.frontend import ast
from mloc.shared.limits import MAX_STEPS, WHY_STEPS


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()


def describe(value: ast.Value) -> str:
    """What a literal is, in words, for "expected X, got Y" messages."""
    match value:
        case ast.Bool():
            return "a boolean"
        case ast.Number(value=int()):
            return f"the integer {value.text}"
        case ast.Number():
            return f"the number {value.text}"
        case ast.String():
            return "a string"
        case ast.ListValue():
            return "a list"
        case ast.TupleValue():
            return "a tuple"
        case ast.Call():
            return f"a call to `{value.func.dotted}`"
        case ast.Name():
            return f"the name `{value.dotted}`"
    return "a value"


class Type:
    """Base class: `expected` names the type in messages."""

    expected = "a value"

    def check(self, value: ast.Value, where: str, diags: Diagnostics):
        raise NotImplementedError

    def _wrong(self, value: ast.Value, where: str, diags: Diagnostics, help: str | None = None):
        diags.error("E304", f"{where} must be {self.expected}, got {describe(value)}", value.span,
                    label=f"expected {self.expected}", help=help)
        return INVALID


def _fmt(x: float) -> str:
    return repr(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


@dataclass(frozen=True)
class Number(Type):
    """A number in [lo, hi] (`open_lo`/`open_hi` exclude an end). `integer=True` for counts.
    `limit`: mloc's own bound on a value the range allows (`why` it is there), reported
    before the type, so that `unroll = 1e20` is told the bound, not "write a whole number"."""

    integer: bool = False
    lo: float = -math.inf
    hi: float = math.inf
    open_lo: bool = False
    open_hi: bool = False
    limit: float = math.inf
    why: str = ""

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "an integer" if self.integer else "a number"

    def _range_text(self) -> str:
        if self.hi == math.inf:
            return f"greater than {_fmt(self.lo)}" if self.open_lo else f"at least {_fmt(self.lo)}"
        if self.lo == -math.inf:
            return f"less than {_fmt(self.hi)}" if self.open_hi else f"at most {_fmt(self.hi)}"
        left, right = "(" if self.open_lo else "[", ")" if self.open_hi else "]"
        return f"in {left}{_fmt(self.lo)}, {_fmt(self.hi)}{right}"

    def in_range(self, x: float) -> bool:
        above = x > self.lo if self.open_lo else x >= self.lo
        below = x < self.hi if self.open_hi else x <= self.hi
        return above and below

    def check(self, value, where, diags):
        if not isinstance(value, ast.Number):
            return self._wrong(value, where, diags)
        if isinstance(value.value, float) and not math.isfinite(value.value):
            diags.error("E305", f"{where} must be a finite number, got {value.text}", value.span,
                        label="overflows to infinity")
            return INVALID
        if value.value > self.limit:
            diags.error("E305", f"{where} must be at most {self.limit}, got {value.text}", value.span,
                        label=f"above {self.limit}", notes=(f"{self.limit} is {self.why}",) if self.why else (),
                        help=f"write a value up to {self.limit}")
            return INVALID
        if self.integer and not isinstance(value.value, int):
            whole = min(max(round(value.value), self.lo), self.hi, self.limit)
            return self._wrong(value, where, diags, help=f"write a whole number, e.g. `{_fmt(whole)}`")
        if not self.in_range(value.value):
            diags.error("E305", f"{where} must be {self._range_text()}, got {value.text}", value.span,
                        label=f"must be {self._range_text()}")
            return INVALID
        return value.value if self.integer else float(value.value)


def Int(lo: float = -math.inf, hi: float = math.inf, limit: int = MAX_STEPS, why: str = WHY_STEPS) -> Number:
    """An integer in [lo, hi], and at most `limit` (:mod:`mloc.shared.limits`)."""
    return Number(integer=True, lo=lo, hi=hi, limit=limit, why=why)


def Float(lo: float = -math.inf, hi: float = math.inf, open_lo: bool = False, open_hi: bool = False) -> Number:
    return Number(integer=False, lo=lo, hi=hi, open_lo=open_lo, open_hi=open_hi)


@dataclass(frozen=True)
class Bool(Type):
    expected = "`true` or `false`"

    def check(self, value, where, diags):
        if isinstance(value, ast.Bool):
            return value.value
        return self._wrong(value, where, diags)


@dataclass(frozen=True)
class Str(Type):
    expected = "a string"

    def check(self, value, where, diags):
        if isinstance(value, ast.String):
            return value.value
        return self._wrong(value, where, diags, help='put it in quotes, e.g. "..."')


@dataclass(frozen=True)
class Enum(Type):
    """One of a fixed set of words, written bare (`bf16`) or quoted (`"bf16"`)."""

    choices: tuple[str, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(f"`{c}`" for c in self.choices)

    def check(self, value, where, diags):
        from mloc.diagnostics import did_you_mean

        word = value.dotted if isinstance(value, ast.Name) else value.value if isinstance(value, ast.String) else None
        if word is None:
            return self._wrong(value, where, diags)
        if word not in self.choices:
            diags.error("E305", f"{where} must be {self.expected}, got `{word}`", value.span,
                        label="not a valid choice", help=did_you_mean(word, self.choices))
            return INVALID
        return word


@dataclass(frozen=True)
class TupleOf(Type):
    items: tuple[Type, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a tuple of {len(self.items)} values"

    def check(self, value, where, diags):
        if not isinstance(value, (ast.TupleValue, ast.ListValue)) or len(value.items) != len(self.items):
            return self._wrong(value, where, diags)
        out = tuple(t.check(v, f"item {i + 1} of {where}", diags)
                    for i, (t, v) in enumerate(zip(self.items, value.items)))
        return INVALID if INVALID in out else out


@dataclass(frozen=True)
class ListOf(Type):
    """A list of `item`s, at least `min_len` long; `increasing`: each item above the last."""

    item: Type
    min_len: int = 0
    increasing: bool = False

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a list of {self.item.expected.removeprefix('a ').removeprefix('an ')}s"

    def check(self, value, where, diags):
        if not isinstance(value, ast.ListValue):
            return self._wrong(value, where, diags, help="write a list in brackets, e.g. [\"encoder.*\"]")
        if len(value.items) < self.min_len:
            diags.error("E305", f"{where} needs at least {self.min_len} item(s)", value.span)
            return INVALID
        out = tuple(self.item.check(v, f"an item of {where}", diags) for v in value.items)
        if INVALID in out:
            return INVALID
        if self.increasing:
            for v, before, now in zip(value.items[1:], out, out[1:]):
                if now <= before:
                    diags.error("E305", f"{where} must increase, but {v.span.text} follows "
                                f"{before!r}", v.span, label="not above the item before",
                                help="list them in increasing order, each once")
                    return INVALID
        return out


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]i?B|B)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class Size(Type):
    """A memory size: a positive number of bytes, or a string such as "4GB" or "512MiB"."""

    expected = 'a memory size such as "4GB" or "512MiB"'

    def check(self, value, where, diags):
        if isinstance(value, ast.Number) and isinstance(value.value, int) and value.value > 0:
            return value.value
        if isinstance(value, ast.String):
            m = _SIZE.match(value.value)
            size = float(m.group(1)) * _UNITS[m.group(2).lower()] if m else 0
            if size > 2**64:            # as an integer literal (E006): also 400 digits, which are inf
                diags.error("E305", f"{where} must be at most 2**64 bytes (16 EiB)", value.span,
                            label="more than 16 EiB", help='write e.g. memory_budget = "8GB"')
                return INVALID
            if size > 0:
                return int(size)
            if m:
                diags.error("E305", f"{where} must be greater than zero, got \"{value.value}\"", value.span,
                            label="must be greater than zero")
                return INVALID
        return self._wrong(value, where, diags, help='write e.g. memory_budget = "8GB"')


@dataclass(frozen=True)
class Device(Type):
    """`cpu`, `cuda`, `auto`, or a string naming one device such as "cuda:1"."""

    expected = '`cpu`, `cuda`, `auto` or a device string such as "cuda:1"'

    def check(self, value, where, diags):
        word = value.dotted if isinstance(value, ast.Name) else value.value if isinstance(value, ast.String) else None
        if word is None:
            return self._wrong(value, where, diags)
        if re.fullmatch(r"cpu|auto|cuda(:\d+)?|mps", word):
            return word
        meant = {"gpu": "cuda", "gpus": "cuda", "cuda0": "cuda:0", "nvidia": "cuda"}.get(word.lower())
        diags.error("E305", f"{where} must be {self.expected}, got `{word}`", value.span,
                    label="not a device", help=f"did you mean `{meant}`?" if meant else None)
        return INVALID


# --- references to Python, and options passed through to it -------------------------------

class PyRef(str):
    """A checked reference to a Python class or function: the string ``"module:attr"``
    (``"torch.optim:RAdam"``; ``attr`` may be dotted) the runtime imports, with ``text``, the
    reference as the program wrote it (``torch.optim.RAdam``, ``lib.make_optimizer``)."""

    text: str

    def __new__(cls, path: str, text: str | None = None) -> "PyRef":
        out = super().__new__(cls, path)
        out.text = text if text is not None else path.replace(":", ".")
        return out


class Options(dict):
    """Keyword arguments passed through to Python as they are (the `Kwargs` of a built-in):
    a dict whose repr is a Python literal. Hashed by its keys (built-ins are frozen values);
    never mutated after checking."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))


@dataclass(frozen=True)
class Ref(Type):
    """A dotted name of a Python class or function (`torch.optim.RAdam`, `lib.make`). The
    checker's binder resolves it against the imports (`mloc.passes.builtins`); `check`
    only checks its shape and returns the `ast.Name`."""

    what: str = "a class or function"
    example: str = "lib.make"

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a dotted name of {self.what}, such as `{self.example}`"

    def check(self, value, where, diags):
        if isinstance(value, ast.Name) and len(value.parts) > 1:
            return value
        return self._wrong(value, where, diags, help=f"name it with its module, e.g. `{self.example}`")


@dataclass(frozen=True)
class Literal(Type):
    """A plain literal passed to Python: a number, string, boolean, `None`, or a list or
    tuple of them (lists stay lists, tuples tuples)."""

    expected = "a number, string, boolean, None, or a list or tuple of them"

    def check(self, value, where, diags):
        match value:
            case ast.Number() | ast.String() | ast.Bool():
                return value.value
            case ast.Name(parts=("None",)):
                return None
            case ast.ListValue() | ast.TupleValue():
                out = [self.check(v, f"an item of {where}", diags) for v in value.items]
                if any(v is INVALID for v in out):
                    return INVALID
                return out if isinstance(value, ast.ListValue) else tuple(out)
        return self._wrong(value, where, diags)


@dataclass(frozen=True)
class Kwargs(Type):
    """The keyword arguments a built-in does not name itself, each an `item`, collected into
    one `Options` (the binder fills it; it takes no value of its own)."""

    item: Type = Literal()
    expected = "keyword arguments"

    def check(self, value, where, diags):
        return self.item.check(value, where, diags)
