"""What `mloc sweep --search` searches: ``--set`` values as ranges, and random draws of them.
No torch, no processes here.

A ``--set PATH=VALUE`` whose value is one of these calls is a **range**; any other value (or
several, comma-separated: a grid axis) is what it was::

    uniform(a, b)       a float drawn uniformly in [a, b]              (a < b)
    loguniform(a, b)    a float whose log is uniform in [log a, log b] (0 < a < b)
    int(a, b)           an integer in [a, b], both ends included       (a <= b; also randint)
    choice(v1, v2, ...) one of the values, each written as in the program

Under ``--search`` a grid axis of several values is a ``choice`` of them and a single value
is fixed; a grid sweep (no ``--search``) refuses ranges. Every range is checked when the
command line is read, before any run (a :class:`~mloc.cli.output.UsageError`, exit 2, that
names the flag and says how to write it).

**Random search** (:func:`random_points`) draws ``--trials`` points from
``random.Random(--search-seed)``, each range of a point in the order of the ``--set`` flags:
the same command draws the same points in any process (nothing depends on hash seeds or
the clock), which is how a rerun finds its finished trials. A drawn float is written with
6 significant digits (``0.0123457``): that text is what the run gets and what it records.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from mloc.cli.output import UsageError

KINDS = ("uniform", "loguniform", "int", "randint", "choice")
_CALL = re.compile(r"^\s*(uniform|loguniform|int|randint|choice)\s*\((.*)\)\s*$", re.S)
_HELP = {
    "uniform": "write uniform(LOW, HIGH) with numbers LOW < HIGH, e.g. uniform(0.0, 0.9)",
    "loguniform": "write loguniform(LOW, HIGH) with numbers 0 < LOW < HIGH, e.g. loguniform(1e-3, 1e-1)",
    "int": "write int(LOW, HIGH) with integers LOW <= HIGH (both included), e.g. int(1, 8)",
    "choice": "write choice(V1, V2, ...) with at least one value, e.g. choice(sgd(lr=0.1), adam(lr=1e-3))",
}


@dataclass(frozen=True)
class Axis:
    """One ``--set``: its ``path`` and either ``values`` (a grid axis, or a choice) or a
    numeric range ``kind`` over [low, high]."""

    path: str
    kind: str                       # "grid", "choice", "uniform", "loguniform" or "int"
    values: tuple[str, ...] = ()
    low: float = 0.0
    high: float = 0.0

    @property
    def is_range(self) -> bool:
        return self.kind != "grid"

    def draw(self, rng: random.Random) -> str:
        """One value, as text for ``--set`` (grid: the first; a grid of several is a choice)."""
        if self.kind in ("choice", "grid"):
            return self.values[0] if len(self.values) == 1 else rng.choice(self.values)
        if self.kind == "int":
            return str(rng.randint(int(self.low), int(self.high)))
        if self.kind == "loguniform":
            return fmt(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return fmt(rng.uniform(self.low, self.high))


def split_values(text: str) -> list[str]:
    """``PATH=V1,V2`` values split at the commas outside brackets and quotes:
    ``neumann(iters=3, alpha=0.1),sama(eps=0.01)`` is two values."""
    values, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def fmt(x: float) -> str:
    """A drawn float as the run gets it: 6 significant digits."""
    return f"{x:.6g}"


def parse_axis(flag: str, path: str, values: list[str]) -> Axis:
    """The axis of ``--set PATH=VALUES`` (``flag`` is the whole flag, for messages)."""
    ranges = [v for v in values if _CALL.match(v)]
    if not ranges:
        return Axis(path, "grid", tuple(values))
    if len(values) > 1:
        raise UsageError(f"--set {flag}: a range must be the flag's only value",
                         help=f"give {ranges[0]} a --set of its own, or write the values as choice(...)")
    kind, inner = _CALL.match(values[0]).groups()
    kind = "int" if kind == "randint" else kind
    args = [a for a in split_values(inner)] if inner.strip() else []
    if kind == "choice":
        if not args or any(not a for a in args):
            raise UsageError(f"--set {flag}: choice() needs values separated by single commas", help=_HELP[kind])
        return Axis(path, kind, tuple(args))
    return _numeric(flag, path, kind, args)


def _numeric(flag: str, path: str, kind: str, args: list[str]) -> Axis:
    number, what = (int, "two integers") if kind == "int" else (float, "two numbers")
    if len(args) != 2:
        raise UsageError(f"--set {flag}: {kind}() takes {what}, got {len(args)} argument"
                         f"{'s' * (len(args) != 1)}", help=_HELP[kind])
    try:
        low, high = (number(a) for a in args)
    except ValueError:
        raise UsageError(f"--set {flag}: {kind}() takes {what}, got {', '.join(args)}", help=_HELP[kind]) from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise UsageError(f"--set {flag}: {kind}() takes finite bounds", help=_HELP[kind])
    if kind == "loguniform" and low <= 0:
        raise UsageError(f"--set {flag}: loguniform() needs a positive lower bound, got {args[0]}",
                         help=_HELP[kind])
    if high < low or (high == low and kind != "int"):
        raise UsageError(f"--set {flag}: {kind}() needs LOW {'<=' if kind == 'int' else '<'} HIGH, "
                         f"got {args[0]} and {args[1]}", help=_HELP[kind])
    return Axis(path, kind, (), low, high)


def axes(sets: list[str]) -> list[Axis]:
    """Every ``--set PATH=VALUE[,VALUE...]`` as an :class:`Axis`, each range checked."""
    found = []
    for s in sets:
        path, eq, values = s.partition("=")
        if not eq or not path.strip():
            raise UsageError(f"--set {s}: expected PATH=VALUE[,VALUE...]",
                             help="e.g. --set 'classifier.optimizer.lr=0.1,0.05' or "
                                  "--set 'classifier.optimizer.lr=loguniform(1e-3,1e-1)'")
        split = split_values(values)
        if any(not v for v in split):
            raise UsageError(f"--set {s}: an empty value", help="separate the values with single commas")
        found.append(parse_axis(s, path.strip(), split))
    return found


def random_points(found: list[Axis], trials: int, seed: int) -> list[tuple[str, ...]]:
    """``trials`` points (``PATH=VALUE`` tuples) drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [tuple(f"{a.path}={a.draw(rng)}" for a in found) for _ in range(trials)]
