"""Program-wide blocks: interlocking chains, the train block and top-level settings."""

from __future__ import annotations

from dataclasses import replace

from mloc.diagnostics import Diagnostics, closest, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import ChainSpec, EvalSpec, TrainSpec
from mloc.lang import vocabulary as V
from mloc.lang.types import INVALID, Int
from mloc.passes.fields import check_value, index_fields, report_missing
from mloc.passes.names import Scope, resolve_pycall
from mloc.passes.selection import resolve_selection
from mloc.shared.strategy import UNAVAILABLE_HELP, unavailable

_EVERY_SYNONYMS = {"save": "checkpoint", "ckpt": "checkpoint", "evaluate": "eval",
                   "validate": "eval", "print": "log", "report": "log"}


def resolve_chains(module: ast.Module, problems: set[str], diags: Diagnostics):
    """Valid chains, the stage groups usable for structure checks, and the problems whose
    chain is too broken to check anything about them (uncertain)."""
    specs, groups, uncertain = [], [], set()
    taken: set[str] = set()
    for c in module.of_type(ast.Chain):
        fields = index_fields(c.body or ast.Block((), c.span), V.CHAIN_FIELDS, "a chain", diags)
        missing = report_missing(fields, V.CHAIN_FIELDS, "a chain", c.span, diags)
        ok = all(_known(s, problems, diags) for s in c.stages)
        ok &= _no_repeats(c, taken, diags)
        if len(c.stages) < 2:
            diags.error("E501", "an interlocking chain needs at least two stages", c.span,
                        help="list the depthwise modules in order, e.g. `chain [stage1, stage2]`")
            ok = False
        if not ok:
            uncertain.update(s.name for s in c.stages)
            uncertain.update(closest(s.name, problems) or s.name for s in c.stages)
            continue
        groups.append(tuple(s.name for s in c.stages))
        n = None if missing else _interlock(c, fields, diags)
        if n is not None:
            monitor = V.CHAIN_FIELDS["monitor"].type.check(fields["monitor"].value, "`monitor`", diags) \
                if "monitor" in fields else False
            specs.append(ChainSpec(groups[-1], n, c.span, monitor is True))
    return tuple(specs), tuple(groups), uncertain


def _no_repeats(c: ast.Chain, taken: set[str], diags: Diagnostics) -> bool:
    ok = True
    for s in c.stages:
        if s.name in taken:
            diags.error("E503", f"problem `{s.name}` is already a stage of a chain", s.span,
                        label="repeated stage", help="each module is one stage of one chain, once")
            ok = False
        taken.add(s.name)
    return ok


def _interlock(c: ast.Chain, fields, diags: Diagnostics) -> int | None:
    value = fields["interlock"].value
    n = Int().check(value, "`interlock`", diags)
    if n is INVALID:
        return None
    k = len(c.stages)
    if not 1 <= n <= k:
        diags.error("E502", f"`interlock` must be between 1 and {k} for a chain of {k} stages, got {n}",
                    value.span, label=f"must be in 1..{k}",
                    help=f"1 is local learning, 2 pairwise, {k} end-to-end backpropagation")
        return None
    return n


def _known(ident: ast.Ident, problems: set[str], diags: Diagnostics) -> bool:
    if ident.name in problems:
        return True
    diags.error("E208", f"no problem named `{ident.name}`", ident.span, label="unknown problem",
                help=did_you_mean(ident.name, problems) or "declare it with `problem NAME { ... }`")
    return False


def resolve_train(module: ast.Module, scope: Scope, diags: Diagnostics) -> TrainSpec:
    blocks = module.of_type(ast.Train)
    for extra in blocks[1:]:
        diags.error("E602", "a program has one `train` block, but this is a second", extra.span,
                    help="merge it into the first")
    if not blocks:
        return TrainSpec()
    block = _named_after_interval(blocks[0], diags)
    fields = index_fields(block.body, V.TRAIN_FIELDS, "the train block", diags, allow_every=True)
    report_missing(fields, V.TRAIN_FIELDS, "the train block", block.span, diags)
    values = {k: check_value(f, V.TRAIN_FIELDS[k], scope, f"`{k}`", diags) for k, f in fields.items()}
    values = {k: v for k, v in values.items() if v is not INVALID}
    if unavailable(values.get("strategy")):
        diags.error("E305", f"`strategy = {values['strategy']}`: {unavailable(values['strategy'])}",
                    fields["strategy"].value.span, label="not yet available", help=UNAVAILABLE_HELP)
    every = _every(block.body, scope, diags)
    return TrainSpec(**values, **every, **resolve_selection(block.body, every["evals"], diags),
                     span=block.span)


def _named_after_interval(train: ast.Train, diags: Diagnostics) -> ast.Train:
    """`eval every 500 acc = lib.f(...)` reads as `eval every 500` and a field `acc`
    (newlines do not end entries): one E310 saying where the name goes, and the pair read
    as the named evaluation meant (no follow-on errors for the field or the metric)."""
    entries, out = train.body.entries, []
    skip = False
    for e, after in zip(entries, (*entries[1:], None)):
        if skip:
            skip = False
            continue
        if isinstance(e, ast.Every) and e.kind.name == "eval" and e.value is None and e.name is None \
                and isinstance(after, ast.Field) and isinstance(after.value, ast.Call) \
                and after.key.name not in V.TRAIN_FIELDS:
            name, every = after.key.name, e.interval.span.text
            span = train.span.source.span(e.span.start, after.span.end)
            diags.error("E310", f"`eval every {every}` needs the evaluation to call, and `{name}` is no field",
                        span, label="the name goes before `every`",
                        help=f"write `eval {name} every {every} = {after.value.span.text}`")
            e, skip = replace(e, value=after.value, name=after.key, span=span), True
        out.append(e)
    return replace(train, body=replace(train.body, entries=tuple(out)))


def _every(block: ast.Block, scope: Scope, diags: Diagnostics) -> dict:
    out: dict = {"evals": []}
    for e in (x for x in block.entries if isinstance(x, ast.Every)):
        kind = e.kind.name
        if kind not in V.TRAIN_EVERY:
            hint = did_you_mean(kind, V.TRAIN_EVERY) or (
                f"did you mean `{_EVERY_SYNONYMS[kind]}`?" if kind in _EVERY_SYNONYMS else
                "use `eval [NAME] every N = CALL`, `checkpoint every N` or `log every N`")
            diags.error("E601", f"unknown periodic action `{kind}`", e.kind.span, help=hint)
            continue
        interval = Int(1).check(e.interval, f"the interval of `{kind}`", diags)
        if kind == "eval":
            if e.value is None:
                diags.error("E310", "`eval every N` needs the evaluation to call", e.span,
                            help="write `eval every 500 = lib.accuracy(model, lib.test_data())`")
                continue
            call = resolve_pycall(e.value, "an evaluation", scope, diags, problems=True, batch=False)
            if call is not None and interval is not INVALID:
                out["evals"].append(_named(EvalSpec(interval, call), e.name, out["evals"], diags))
        elif e.name is not None:
            diags.error("E601", f"only evaluations are named, but this names a `{kind}`", e.name.span,
                        help=f"write `{kind} every N`")
        elif e.value is not None:
            diags.error("E304", f"`{kind} every N` takes no value", e.value.span,
                        help=f"write `{kind} every N`")
        elif interval is not INVALID:
            out[V.interval_field(kind)] = interval
    out["evals"] = tuple(out["evals"])
    return out


def _named(spec: EvalSpec, name: ast.Ident | None, before: list[EvalSpec], diags: Diagnostics) -> EvalSpec:
    """The evaluation with its name: the written one, or the called function's (E605 when
    an earlier evaluation has it: its metrics would overwrite each other)."""
    text = name.name if name else spec.call.attr.split(".")[-1]
    clash = next((b for b in before if b.name == text), None)
    if clash is not None:
        span = name.span if name else spec.call.span
        diags.error("E605", f"two evaluations are named `{text}`", span, label="second one",
                    notes=(f"the first is at {clash.call.span}",),
                    help=f"name them apart: `eval {text}_2 every N = ...`"
                    if name else f"name this one: `eval NAME every {spec.every} = {spec.call.text}`")
    return replace(spec, name=text, named=name is not None)


def resolve_settings(module: ast.Module, diags: Diagnostics) -> str:
    fields = index_fields(ast.Block(module.of_type(ast.Setting), module.span), V.SETTINGS,
                          "the program", diags, unknown="E214")
    if "semantics" not in fields:
        return "exact"
    value = V.SETTINGS["semantics"].type.check(fields["semantics"].value, "`semantics`", diags)
    return "exact" if value is INVALID else value
