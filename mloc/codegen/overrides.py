"""`--set PATH=VALUE`: change a field of the program, or one argument of a call in it, for one run.

    classifier.optimizer=adam(lr=1e-3)          a problem's field (added when the file lacks it)
    weight_net->classifier.hypergrad=cg()       an edge's field
    train.steps=100                             the train block's
    train.log_every=25                          a periodic action: `log every 25` (also
                                                checkpoint_every), the names `mloc graph` prints
    semantics=per_edge                          a program setting
    classifier.optimizer.lr=0.05                one argument of the call a field holds: the
                                                call's other arguments stay as the file has them
    classifier.module.hidden=128                (any call: built-ins and your own)
    e.hypergrad.alpha=0.1                       (a bare `hypergrad = neumann` becomes a call)

All overrides are applied together, then the file is checked once: each is spliced into the
source text in place of the value it names (or added to its block when absent), whole fields
before arguments of them, so the order of the `--set`s never matters and an intermediate
state is never checked. An override gets exactly the diagnostics the same text would get in
the file, with a note naming the `--set` it came from (`Applied.annotate`). A path that names
nothing, names one thing twice, or cannot be read is an `OverrideError` that says which
`--set`, what is wrong and how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

from mloc.diagnostics import Diagnostic, DiagnosticError, did_you_mean
from mloc.frontend import ast
from mloc.frontend.parse import parse
from mloc.lang.vocabulary import EDGE_FIELDS, PROBLEM_FIELDS, SETTINGS, TRAIN_FIELDS, TRAIN_INTERVALS
from mloc.source import SourceFile

_IDENT = r"[A-Za-z_]\w*"
_SET = re.compile(rf"^\s*(?P<head>{_IDENT}(?:\s*->\s*{_IDENT})?)(?P<path>(?:\s*\.\s*\w+)*)\s*=(?P<value>.*)$", re.S)
_FORM = ("write PATH=VALUE: PROBLEM.FIELD, UPPER->LOWER.FIELD, train.FIELD or SETTING, optionally "
         "followed by .ARGUMENT for one argument of a call, e.g. classifier.optimizer.lr=0.05")


class OverrideError(ValueError):
    """A `--set` that cannot be read, names nothing in the program, or repeats another.

    `message` says which `--set` and what is wrong, `help` how to fix it; `str()` shows both,
    as the CLI renders a usage error."""

    def __init__(self, message: str, help: str | None = None):
        self.message, self.help = message, help
        super().__init__(message + (f"\n  = help: {help}" if help else ""))


@dataclass(frozen=True)
class Override:
    """One `--set`: `head` is a problem, `UPPER->LOWER`, `train` or a program setting;
    `path` the field, then the arguments of the call it holds (empty for a setting)."""

    head: str
    path: tuple[str, ...]
    value: str

    @classmethod
    def parse(cls, text: str) -> "Override":
        m = _SET.match(text)
        if not m:
            raise OverrideError(f"cannot read --set {text!r}", _FORM)
        head = re.sub(r"\s+", "", m.group("head"))
        path = tuple(p.strip() for p in m.group("path").split(".")[1:])
        value = m.group("value").strip()
        if not value:
            raise OverrideError(f"--set {text!r} gives no value after `=`", _FORM)
        return cls(head, path, value)

    @property
    def key(self) -> str:
        """What it sets, e.g. `classifier.optimizer.lr`."""
        return ".".join((self.head, *self.path))

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def flag(self) -> str:
        """As it would be typed: `--set 'classifier.optimizer.lr=0.05'`."""
        return f"--set '{self}'"


@dataclass(frozen=True)
class Applied:
    """The source with every override spliced in; `regions` are the spliced ranges of its
    text with the override each came from; `overrides` in the order they were applied;
    `original` the file as read and `edits` the splices made into it, in order, as
    (start, end, length of the new text), to find a spliced offset in the file again."""

    source: SourceFile
    overrides: tuple[Override, ...] = ()
    regions: tuple[tuple[int, int, Override], ...] = ()
    original: SourceFile | None = None
    edits: tuple[tuple[int, int, int], ...] = ()

    def annotate(self, diagnostics: Sequence[Diagnostic]) -> tuple[Diagnostic, ...]:
        """Each diagnostic that points into spliced text: moved onto its `--set` when it lies
        inside one (the line it would show may not exist in the file); one whose line holds
        spliced text is shown at the file's own line, with a note naming each `--set`."""
        out = []
        for d in diagnostics:
            if d.span is not None and d.span.source.text == self.source.text:
                moved = next((self._at_set(d, s, e, ov) for s, e, ov in self.regions
                              if s <= d.span.start and d.span.end <= e), None)
                d = moved or self._at_file(d)
            out.append(d)
        return tuple(out)

    def _at_file(self, d: Diagnostic) -> Diagnostic:
        """`d` on the file as written when the line it shows (or its span) holds spliced
        text, which is on no line of the file, with a note naming each `--set` there."""
        text, start, end = self.source.text, d.span.start, d.span.end
        lo, hi = text.rfind("\n", 0, start) + 1, text.find("\n", start)
        lo, hi = min(lo, start), max(end, len(text) if hi < 0 else hi)
        touching = [ov for s, e, ov in self.regions if s < hi and e > lo]
        if not touching or self.original is None:
            return d
        span = self.original.span(self._in_file(start, False), self._in_file(end, True))
        notes = tuple(f"this line is changed by {ov.flag}, as set for this command" for ov in touching)
        return replace(d, span=span, notes=d.notes + notes)

    def _in_file(self, offset: int, is_end: bool) -> int:
        """`offset` in the spliced text as an offset in the file: an offset inside spliced
        text goes to the start of the text it replaced (its end, for a span's end)."""
        for start, end, length in reversed(self.edits):
            if offset >= start + length:
                offset -= length - (end - start)
            elif offset > start:
                offset = end if is_end else start
        return offset

    def _at_set(self, d: Diagnostic, start: int, end: int, ov: Override) -> Diagnostic:
        """`d`, whose span lies in the text `ov` spliced at [start, end), on a pseudo-source
        holding the `--set` as typed: at the same characters of its value, at the name of
        its path that the span covers, or else at the whole `PATH=VALUE`."""
        flag, text = ov.flag, d.span.text
        value_at = len("--set '") + len(ov.key) + 1
        found = self.source.text.rfind(ov.value, start, end)
        if found >= 0 and found <= d.span.start and d.span.end <= found + len(ov.value):
            at, width = value_at + d.span.start - found, len(text)
        elif text and (named := flag.rfind(text, 0, value_at)) >= len("--set '"):
            at, width = named, len(text)
        else:
            at, width = len("--set '"), len(str(ov))
        note = f"`{ov.key}` in {self.source.path}, as set for this command"
        return replace(d, span=SourceFile("--set", flag).span(at, at + width), notes=d.notes + (note,))


def parse_all(texts: Sequence[str]) -> tuple[Override, ...]:
    """The overrides in the order they are applied (fields before arguments of them, then by
    what they set), so any order of the same `--set`s gives the same text; a thing set twice
    is an error."""
    overrides = [Override.parse(t) for t in texts]
    seen: dict[str, Override] = {}
    for ov in overrides:
        if ov.key in seen:
            raise OverrideError(f"{seen[ov.key].flag} and {ov.flag} both set `{ov.key}`",
                                "give each field or argument once")
        seen[ov.key] = ov
    return tuple(sorted(overrides, key=lambda o: (len(o.path), o.key)))


def apply_all(src: SourceFile, texts: Sequence[str]) -> Applied:
    """Splice every override into `src`. Each is located in the file as the previous ones
    left it (parsed, never checked); a text that no longer parses stops the splicing, and
    the check of what was spliced so far reports it."""
    overrides = parse_all(texts)
    text, regions, edits = src.text, (), ()
    for ov in overrides:
        try:
            module = parse(SourceFile(src.path, text))
        except DiagnosticError:
            break
        start, end, new = edit(text, module, ov)
        text = text[:start] + new + text[end:]
        regions = _shift(regions, start, end, len(new)) + ((start, start + len(new), ov),)
        edits += ((start, end, len(new)),)
    return Applied(SourceFile(src.path, text), overrides, regions, src, edits)


def _shift(regions, start: int, end: int, length: int) -> tuple:
    """`regions` after text[start:end] was replaced by `length` characters."""
    delta = length - (end - start)
    out = []
    for s, e, ov in regions:
        if e <= start:
            out.append((s, e, ov))
        elif s >= end:
            out.append((s + delta, e + delta, ov))
        else:                       # the edit falls inside an earlier override's text
            out.append((min(s, start), max(e + delta, start + length), ov))
    return tuple(out)


# --- locating what an override names ------------------------------------------------------

def edit(text: str, module: ast.Module, ov: Override) -> tuple[int, int, str]:
    """(start, end, new text): the override as one splice into `text`."""
    kind, owner, fields, field, args = _target(module, ov)
    if field not in fields:
        hint = did_you_mean(field, fields)
        noun = "setting" if kind == "setting" else "field"
        raise OverrideError(f"{ov.flag}: {owner} has no {noun} `{field}`",
                            (hint + " " if hint else "") + f"its {noun}s: {', '.join(fields)}"
                            + ("; a problem's field is PROBLEM.FIELD" if kind == "setting" else ""))
    where = ov.key[:len(ov.key) - len(".".join(args)) - bool(args)]     # the path to the field
    if kind == "train" and field in TRAIN_INTERVALS:
        return _interval(text, module, ov, field, args, where)
    value = _value_of(module, kind, ov.head, field)
    if value is None:
        if args:
            raise OverrideError(f"{ov.flag}: {owner} does not set `{field}` in the file, so there is no call "
                                f"whose `{args[0]}` could change",
                                f"set the whole value, e.g. --set '{where}=CALL({args[0]}={ov.value})'")
        return _insertion(text, module, kind, ov)
    return _in_value(value, args, ov, where)


def _target(module: ast.Module, ov: Override):
    """(kind, description, its fields, field, arguments) of what `ov.head` names."""
    problems = [p.name.name for p in module.of_type(ast.Problem)]
    if "->" in ov.head:
        kind, owner, fields = "edge", f"the edge `{ov.head.replace('->', ' -> ')}`", EDGE_FIELDS
        _edge(module, ov)
    elif ov.head == "train":
        kind, owner, fields = "train", "the train block", {**TRAIN_FIELDS, **TRAIN_INTERVALS}
    elif ov.head in problems:
        kind, owner, fields = "problem", f"problem `{ov.head}`", PROBLEM_FIELDS
    elif ov.head in SETTINGS or ov.head in {s.key.name for s in module.of_type(ast.Setting)} or not ov.path:
        return "setting", "the program", SETTINGS, ov.head, ov.path
    else:
        hint = did_you_mean(ov.head, problems + ["train", *SETTINGS])
        raise OverrideError(f"{ov.flag}: the program has no problem, edge or setting `{ov.head}`",
                            (hint + " " if hint else "") + f"problems: {', '.join(problems) or 'none'}; "
                            "an edge is UPPER->LOWER, the train block `train`")
    if not ov.path:
        raise OverrideError(f"{ov.flag} names {owner} but none of its fields",
                            f"write {ov.head}.FIELD=VALUE with FIELD one of: {', '.join(fields)}")
    return kind, owner, fields, ov.path[0], ov.path[1:]


def _edge(module: ast.Module, ov: Override) -> ast.Edge:
    up, low = ov.head.split("->")
    for e in module.of_type(ast.Edge):
        pairs = list(zip((i.name for i in e.path), (i.name for i in e.path[1:])))
        if (up, low) in pairs:
            if len(pairs) > 1:
                raise OverrideError(f"{ov.flag}: the edge {up} -> {low} is declared in a chain `a -> b -> c`",
                                    "split the chain into one declaration per edge to override one of them")
            return e
    declared = [f"{a}->{b}" for e in module.of_type(ast.Edge) for a, b in
                zip((i.name for i in e.path), (i.name for i in e.path[1:]))]
    hint = did_you_mean(ov.head, declared)
    raise OverrideError(f"{ov.flag}: the program has no edge {up} -> {low}",
                        (hint + " " if hint else "") + f"its edges: {', '.join(declared) or 'none'}")


def _block(module: ast.Module, kind: str, head: str) -> ast.Block | None:
    if kind == "train":
        trains = module.of_type(ast.Train)
        return trains[0].body if trains else None
    if kind == "edge":
        up, low = head.split("->")
        return next(e.body for e in module.of_type(ast.Edge)
                    if (up, low) in zip((i.name for i in e.path), (i.name for i in e.path[1:])))
    return next(p.body for p in module.of_type(ast.Problem) if p.name.name == head)


def _value_of(module: ast.Module, kind: str, head: str, field: str) -> ast.Value | None:
    if kind == "setting":
        return next((s.value for s in module.of_type(ast.Setting) if s.key.name == field), None)
    block = _block(module, kind, head)
    entries = block.entries if block is not None else ()
    return next((f.value for f in entries if isinstance(f, ast.Field) and f.key.name == field), None)


def _interval(text: str, module: ast.Module, ov: Override, field: str, args: tuple[str, ...],
              where: str) -> tuple[int, int, str]:
    """`train.log_every=25`: the interval of the file's `log every N` (the last one, which is
    the one that counts), or `log every 25` added to the train block."""
    action = TRAIN_INTERVALS[field]
    block = _block(module, "train", "train")
    entries = [e for e in (block.entries if block is not None else ())
               if isinstance(e, ast.Every) and e.kind.name == action and e.name is None]
    if entries:
        return _in_value(entries[-1].interval, args, ov, where)
    if args:
        raise OverrideError(f"{ov.flag}: the train block has no `{action} every N`, so there is no call whose "
                            f"`{args[0]}` could change", f"set the interval: --set '{where}=N'")
    return _insertion(text, module, "train", ov, f"{action} every {ov.value}")


def _insertion(text: str, module: ast.Module, kind: str, ov: Override,
               entry: str | None = None) -> tuple[int, int, str]:
    """Add a field the file does not set (or `entry`, the text of another kind of entry): at
    the end of its block, on the line of its closing brace (no line is added, so the lines
    after it keep their numbers), after a comma when the last entry is on that line without one."""
    field, end = ov.path[0] if ov.path else ov.head, len(text)
    entry = entry or f"{field} = {ov.value}"
    if kind == "setting":
        return end, end, f"\n{entry}\n"
    block = _block(module, kind, ov.head)
    if block is None and kind == "train":
        return end, end, f"\ntrain {{ {entry} }}\n"
    if block is None:                   # an edge without braces
        e = _edge(module, ov)
        return e.span.end, e.span.end, f" {{ {entry} }}"
    close = block.span.end - 1          # the closing brace
    last = block.entries[-1].span.end if block.entries else close
    if not re.fullmatch(r"[ \t]*", text[last:close]) or last == close:   # after a separator or a line break
        return close, close, f" {entry} "
    return last, last, f", {entry}"


def _in_value(value: ast.Value, args: tuple[str, ...], ov: Override, where: str) -> tuple[int, int, str]:
    """Replace `value` (what the path `where` names), or (with `args`) the argument they
    name inside the call it is."""
    if not args:
        return value.span.start, value.span.end, ov.value
    name, rest = args[0], args[1:]
    if isinstance(value, ast.Name) and not rest and not name.isdigit():   # `neumann` = `neumann()`
        return value.span.start, value.span.end, f"{value.dotted}({name}={ov.value})"
    if not isinstance(value, ast.Call):
        raise OverrideError(f"{ov.flag}: `{where}` is `{value.span.text}`, not a call, so it has no argument "
                            f"`{name}`", f"set the whole value: --set '{where}=VALUE'")
    arg = _argument(value, name)
    if arg is not None:
        return _in_value(arg.value, rest, ov, f"{where}.{name}")
    if rest or name.isdigit():
        given = [a.keyword.name if a.keyword else str(i) for i, a in enumerate(value.args)]
        raise OverrideError(f"{ov.flag}: `{where}` is `{value.span.text}`, which has no argument `{name}`",
                            f"its arguments: {', '.join(given) or 'none'}; a missing keyword argument "
                            "can be added only as the last part of the path")
    if value.args:
        pos = value.args[-1].span.end
        return pos, pos, f", {name}={ov.value}"
    pos = value.span.end - 1            # before the closing parenthesis
    return pos, pos, f"{name}={ov.value}"


def _argument(call: ast.Call, name: str) -> ast.Arg | None:
    """The keyword argument `name`, or the positional one at index `name`."""
    if name.isdigit():
        positional = [a for a in call.args if a.keyword is None]
        return positional[int(name)] if int(name) < len(positional) else None
    return next((a for a in call.args if a.keyword is not None and a.keyword.name == name), None)


def merge_recorded(recorded: Sequence[str], given: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """The overrides a resume compiles with (:mod:`mloc.runtime.files.resumption`): the
    ``recorded`` ones, each replaced by a ``given`` one that sets the same path or a whole
    field above it, then the given ones (in the order given); and a line for each change."""
    new = [Override.parse(t) for t in given]
    kept, lines = [], []
    for text in recorded:
        old = Override.parse(text)
        over = next((n for n in new if old.key == n.key or old.key.startswith(n.key + ".")), None)
        if over is None:
            kept.append(text)
        elif old.key != over.key:
            lines.append(f"{over.flag} replaces the run's whole `{over.key}`, and with it its {old.flag}")
        elif str(old) != str(over):
            lines.append(f"{over.flag} replaces the run's {old.flag}")
    old_keys = {Override.parse(t).key for t in recorded}
    lines += [f"{n.flag} is added to the run's overrides" for n in new if n.key not in old_keys]
    return tuple(kept) + tuple(given), lines


def train_fields(given: Sequence[str]) -> set[str]:
    """The train block's fields F that a ``--set train.F=...`` of ``given`` sets."""
    return {o.path[0] for o in map(Override.parse, given) if o.head == "train" and len(o.path) == 1}
