"""Fields of a block: index them (unknown, duplicate, missing) and check their values."""

from __future__ import annotations

from mloc.builtins import TABLES
from mloc.diagnostics import Diagnostics, closest, did_you_mean
from mloc.frontend import ast
from mloc.lang import vocabulary as V
from mloc.lang.types import INVALID, Bool
from mloc.passes.builtins import bind_builtin
from mloc.passes.names import Scope, resolve_pycall

# Where a field that is unknown in one block does belong, for a better `help:`.
_HOMES = (("a `problem` block", V.PROBLEM_FIELDS), ("the `train` block", V.TRAIN_FIELDS),
          ("a hierarchy edge's braces", V.EDGE_FIELDS), ("a `chain` block", V.CHAIN_FIELDS),
          ("the top level of the program", V.SETTINGS))


class Fields(dict):
    """{name: Field} plus the names a misspelt key was taken to mean (not reported missing)."""

    suggested: set[str]


def index_fields(block: ast.Block, table: dict[str, V.FieldSpec], owner: str, diags: Diagnostics,
                 *, allow_every: bool = False, unknown: str = "E202") -> Fields:
    """Index a block's fields, reporting unknown and duplicate ones."""
    seen = Fields()
    seen.suggested = set()
    noun = "setting" if unknown == "E214" else "field"
    for entry in block.entries:
        if isinstance(entry, (ast.Every, ast.Watch, ast.Stop)):
            if not allow_every:
                what = {ast.Every: "every", ast.Watch: "checkpoint best", ast.Stop: "stop when"}[type(entry)]
                diags.error("E202", f"`{what}` entries belong in the train block, not in {owner}",
                            entry.span, help="move it into `train { ... }`")
            continue
        key = entry.key.name
        if key not in table:
            diags.error(unknown, f"{owner} has no {noun} `{key}`", entry.key.span,
                        label=f"unknown {noun}", help=_unknown_help(key, table, seen))
        elif key in seen:
            diags.error("E103", f"{noun} `{key}` is set twice in {owner}", entry.key.span,
                        label="second assignment", notes=(f"first set at {seen[key].key.span}",),
                        help="remove one of them")
        else:
            seen[key] = entry
    return seen


def _unknown_help(key: str, table: dict, seen: Fields) -> str:
    meant = closest(key, table)
    if meant:
        seen.suggested.add(meant)
        return f"did you mean `{meant}`?"
    home = next((where for where, other in _HOMES if key in other and other is not table), None)
    if home:
        return f"`{key}` belongs in {home}"
    return "valid here: " + ", ".join(f"`{k}`" for k in table)


def report_missing(fields: Fields, table: dict[str, V.FieldSpec], owner: str, span,
                   diags: Diagnostics) -> bool:
    """E201 for each required field absent (and not the likely target of a typo)."""
    missing = [f for f in table.values() if f.required and f.name not in fields]
    for f in missing:
        if f.name not in getattr(fields, "suggested", ()):
            diags.error("E201", f"{owner} is missing the field `{f.name}`", span,
                        help=f"add `{f.name} = ...`: {f.doc}")
    return bool(missing)


def check_value(field: ast.Field, spec: V.FieldSpec, scope: Scope, where: str, diags: Diagnostics):
    """Check one field's value according to its spec; INVALID after reporting."""
    if spec.kind == "pycall" or (spec.kind == "flag_or_pycall" and isinstance(field.value, ast.Call)):
        out = resolve_pycall(field.value, where, scope, diags, problems=spec.problems, batch=spec.batch)
    elif spec.kind == "builtin":
        out = bind_builtin(field.value, TABLES[spec.table], spec.table, diags, scope)
    elif spec.kind == "problem":
        out = problem_ref(field.value, scope, where, diags)
    elif spec.kind == "flag_or_pycall" and not isinstance(field.value, ast.Call):
        out = Bool().check(field.value, where, diags)
    else:
        out = spec.type.check(field.value, where, diags)
    return INVALID if out is None else out


def problem_ref(value: ast.Value, scope: Scope, where: str, diags: Diagnostics):
    if isinstance(value, ast.Name) and value.dotted in scope.problems:
        return (value.dotted, value.span)
    word = value.dotted if isinstance(value, ast.Name) else None
    hint = did_you_mean(word, scope.problems) if word else None
    diags.error("E208", f"{where} must name a problem", value.span, label="not a problem",
                help=hint or "problems: " + ", ".join(f"`{p}`" for p in sorted(scope.problems)))
    return INVALID
