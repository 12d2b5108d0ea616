"""`--set TARGET.FIELD=VALUE`: change a field of the program for one run, checked like the file.

Targets: a problem (`classifier.optimizer=adam(lr=1e-3)`), an edge
(`weight_net->classifier.hypergrad=neumann(iters=3, alpha=0.1)`), the train block
(`train.steps=100`) or a program setting (`semantics=per_edge`). The override is spliced
into the source text in place of the field's value (or added to its block when absent),
and the whole file is checked again, so an override gets exactly the diagnostics the same
text would get in the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mloc.frontend import ast

_SET = re.compile(r"^\s*(?:(?P<target>[A-Za-z_]\w*(?:\s*->\s*[A-Za-z_]\w*)?)\s*\.\s*)?(?P<field>[A-Za-z_]\w*)\s*=(?P<value>.+)$",
                  re.S)


class OverrideError(ValueError):
    """A `--set` that names nothing in the program or is not of the form TARGET.FIELD=VALUE."""


@dataclass(frozen=True)
class Override:
    target: str | None      # problem name, "upper->lower", "train", or None (a program setting)
    field: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "Override":
        m = _SET.match(text)
        if not m:
            raise OverrideError(f"cannot read --set {text!r}; write TARGET.FIELD=VALUE, e.g. "
                                "classifier.optimizer=adam(lr=1e-3) or train.steps=100")
        target = re.sub(r"\s+", "", m.group("target")) if m.group("target") else None
        return cls(target, m.group("field"), m.group("value").strip())


def _block_of(module: ast.Module, target: str | None):
    if target is None:
        return None
    if target == "train":
        blocks = module.of_type(ast.Train)
        return blocks[0].body if blocks else None
    if "->" in target:
        up, low = target.split("->")
        for e in module.of_type(ast.Edge):
            pairs = list(zip((i.name for i in e.path), (i.name for i in e.path[1:])))
            if (up, low) in pairs:
                if len(pairs) > 1:
                    raise OverrideError(f"the edge {up} -> {low} is declared in a chain `a -> b -> c`; "
                                        "split it to override one edge")
                return e.body if e.body is not None else e
        raise OverrideError(f"the program has no edge {up} -> {low}")
    for p in module.of_type(ast.Problem):
        if p.name.name == target:
            return p.body
    raise OverrideError(f"the program has no problem `{target}` (targets: a problem, UPPER->LOWER, train)")


def apply(text: str, module: ast.Module, override: Override) -> str:
    """The source text with the override spliced in."""
    if override.target is None:
        for s in module.of_type(ast.Setting):
            if s.key.name == override.field:
                return text[:s.value.span.start] + override.value + text[s.value.span.end:]
        return text + f"\n{override.field} = {override.value}\n"
    block = _block_of(module, override.target)
    if block is None:
        if override.target == "train":
            return text + f"\ntrain {{ {override.field} = {override.value} }}\n"
        raise OverrideError(f"cannot find {override.target}")
    if isinstance(block, ast.Edge):   # an edge without braces
        end = block.span.end
        return text[:end] + f" {{ {override.field} = {override.value} }}" + text[end:]
    for entry in block.entries:
        if isinstance(entry, ast.Field) and entry.key.name == override.field:
            return text[:entry.value.span.start] + override.value + text[entry.value.span.end:]
    close = block.span.end - 1     # the closing brace
    return text[:close] + f" {override.field} = {override.value} " + text[close:]
