"""The resolve pass: the parsed file -> checked problems, edges and program settings.

Reports every independent error at once: missing/duplicate `program`, imports that cannot be
found, duplicate problems, unknown/missing/duplicate fields, names, built-in calls and their
arguments, methods that cannot handle the lower problem's optimizer, and the train block.
Graph-level facts (cycles, orphans, dataflow) are checked after lowering.
"""

from __future__ import annotations

from dataclasses import replace

from mloc.diagnostics import Diagnostics, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import (ChainSpec, EvalSpec, HierarchyEdge, ImportSpec, Link, ProblemNode,
                              ProgramInfo, ResolvedProgram, TrainSpec)
from mloc.lang import vocabulary as V
from mloc.lang.types import INVALID, Int
from mloc.passes.builtins import bind_builtin
from mloc.passes.methods import check_method
from mloc.passes.names import Scope, resolve_pycall
from mloc.passes.pymodules import find_module
from mloc.source import SourceFile

KEYWORDS = frozenset({"program", "import", "as", "problem", "chain", "train", "every", "true",
                      "false", "batch"})


def resolve(module: ast.Module, src: SourceFile, diags: Diagnostics) -> ResolvedProgram:
    name = _program_name(module, src, diags)
    scope = Scope(_imports(module, src, diags), set(), set())
    problem_asts = _unique_problems(module, diags)
    scope.problems.update(problem_asts)
    problems = tuple(p for p in (_problem(a, i, scope, diags) for i, a in enumerate(problem_asts.values()))
                     if p is not None)
    by_name = {p.name: p for p in problems}
    edges, links = _edges(module, problem_asts, by_name, diags)
    chains = tuple(c for c in (_chain(c, problem_asts, diags) for c in module.of_type(ast.Chain)) if c)
    train = _train(module, scope, diags)
    semantics = _settings(module, diags)
    for imp in module.of_type(ast.Import):
        if imp.bound not in scope.used_imports and scope.imports.get(imp.bound) is not None:
            diags.warn("W101", f"`{imp.bound}` is imported but never used", imp.span,
                       help="remove the import")
    imports = tuple(ImportSpec(i.module.dotted, i.bound, _path(scope, i.bound), i.span)
                    for i in module.of_type(ast.Import))
    info = ProgramInfo(name, src.path, imports, semantics, train, chains)
    return ResolvedProgram(info, problems, edges, tuple(problem_asts),
                           tuple(a.name.span for a in problem_asts.values()), links,
                           _program_span(module, src))


def _path(scope: Scope, bound: str) -> str | None:
    info = scope.imports.get(bound)
    return str(info.path) if info and info.path else None


def _program_span(module: ast.Module, src: SourceFile):
    decls = module.of_type(ast.ProgramDecl)
    return decls[0].span if decls else src.span(0, 0)


def _program_name(module: ast.Module, src: SourceFile, diags: Diagnostics) -> str:
    decls = module.of_type(ast.ProgramDecl)
    if not decls:
        diags.error("E005", "the file does not say which program it is", src.span(0, 0),
                    help="start the file with `program NAME`")
        return "unnamed"
    for extra in decls[1:]:
        diags.error("E005", "a file holds one program, but this is a second `program` line",
                    extra.span, help=f"remove it; this file is program `{decls[0].name.name}`")
    return decls[0].name.name


def _imports(module: ast.Module, src: SourceFile, diags: Diagnostics) -> dict:
    bound: dict = {}
    for imp in module.of_type(ast.Import):
        if imp.bound in bound:
            diags.error("E104", f"`{imp.bound}` is already bound by another import", imp.span,
                        help="give this import a different alias with `as`")
            continue
        info = find_module(imp.module.dotted, src.directory)
        if info is None:
            diags.error("E105", f"cannot find the Python module `{imp.module.dotted}`",
                        imp.module.span, label="not found",
                        help=f"put `{imp.module.parts[-1]}.py` beside {src.path}, or install it")
        bound[imp.bound] = info
    return bound


def _unique_problems(module: ast.Module, diags: Diagnostics) -> dict[str, ast.Problem]:
    out: dict[str, ast.Problem] = {}
    for p in module.of_type(ast.Problem):
        if p.name.name in KEYWORDS:
            diags.error("E107", f"`{p.name.name}` is reserved and cannot name a problem",
                        p.name.span, help="choose another name")
        elif p.name.name in out:
            first = out[p.name.name].name.span
            diags.error("E102", f"problem `{p.name.name}` is defined twice", p.name.span,
                        label="second definition", notes=(f"first defined at {first}",),
                        help="rename or remove one of them")
        else:
            out[p.name.name] = p
    return out


def _fields(block: ast.Block, table: dict[str, V.FieldSpec], owner: str, diags: Diagnostics,
            *, allow_every: bool = False, unknown: str = "E202") -> dict[str, ast.Field]:
    """Index a block's fields, reporting unknown, duplicate and missing ones."""
    seen: dict[str, ast.Field] = {}
    for entry in block.entries:
        if isinstance(entry, ast.Every):
            if not allow_every:
                diags.error("E202", f"`every` entries belong in the train block, not in {owner}",
                            entry.span, help="move it into `train { ... }`")
            continue
        key = entry.key.name
        if key not in table:
            hint = did_you_mean(key, table) or "fields here: " + ", ".join(f"`{k}`" for k in table)
            diags.error(unknown, f"{owner} has no {'setting' if unknown == 'E214' else 'field'} `{key}`",
                        entry.key.span,
                        label="unknown field", help=hint)
        elif key in seen:
            diags.error("E103", f"field `{key}` is set twice in {owner}", entry.key.span,
                        label="second assignment", notes=(f"first set at {seen[key].key.span}",),
                        help="remove one of them")
        else:
            seen[key] = entry
    return seen


def _missing(fields: dict, table: dict[str, V.FieldSpec], owner: str, span, diags: Diagnostics) -> bool:
    missing = [f for f in table.values() if f.required and f.name not in fields]
    for f in missing:
        diags.error("E201", f"{owner} is missing the field `{f.name}`", span,
                    help=f"add `{f.name} = ...`: {f.doc}")
    return bool(missing)


def _value(field: ast.Field, spec: V.FieldSpec, scope: Scope, where: str, diags: Diagnostics):
    """Check one field's value according to its spec; INVALID after reporting."""
    if spec.kind == "pycall":
        out = resolve_pycall(field.value, where, scope, diags, problems=spec.problems, batch=spec.batch)
    elif spec.kind == "builtin":
        out = bind_builtin(field.value, V.TABLES[spec.table], spec.table, diags)
    elif spec.kind == "problem":
        out = _problem_ref(field.value, scope, where, diags)
    else:
        out = spec.type.check(field.value, where, diags)
    return INVALID if out is None else out


def _problem_ref(value: ast.Value, scope: Scope, where: str, diags: Diagnostics):
    if isinstance(value, ast.Name) and value.dotted in scope.problems:
        return (value.dotted, value.span)
    word = value.dotted if isinstance(value, ast.Name) else None
    hint = did_you_mean(word, scope.problems) if word else None
    diags.error("E208", f"{where} must name a problem", value.span, label="not a problem",
                help=hint or "problems: " + ", ".join(f"`{p}`" for p in sorted(scope.problems)))
    return INVALID


def _problem(p: ast.Problem, order: int, scope: Scope, diags: Diagnostics) -> ProblemNode | None:
    owner = f"problem `{p.name.name}`"
    fields = _fields(p.body, V.PROBLEM_FIELDS, owner, diags)
    missing = _missing(fields, V.PROBLEM_FIELDS, owner, p.name.span, diags)
    values = {k: _value(f, V.PROBLEM_FIELDS[k], scope, f"`{k}` of `{p.name.name}`", diags)
              for k, f in fields.items()}
    if missing or INVALID in values.values():
        return None
    _warn_unused_args(values["optimizer"], diags)
    return ProblemNode(name=p.name.name, span=p.span, name_span=p.name.span, order=order, **values)


def _warn_unused_args(opt, diags: Diagnostics) -> None:
    args = dict(opt.args)
    if args.get("nesterov") and args.get("momentum") == 0 and opt.name == "sgd":
        diags.warn("W102", "`nesterov=true` has no effect without momentum", opt.span,
                   help="set `momentum`, e.g. momentum=0.9")


def _edges(module: ast.Module, problem_asts: dict, by_name: dict, diags: Diagnostics):
    edges: dict[tuple[str, str], HierarchyEdge] = {}
    links: dict[tuple[str, str], Link] = {}
    for e in module.of_type(ast.Edge):
        fields = _fields(e.body, V.EDGE_FIELDS, "a hierarchy edge", diags) if e.body else {}
        method = bind_builtin(fields["hypergrad"].value, V.METHODS, "methods", diags) \
            if "hypergrad" in fields else bind_builtin(ast.Name(("auto",), e.span), V.METHODS, "methods", diags)
        unroll = V.EDGE_FIELDS["unroll"].type.check(fields["unroll"].value, "`unroll`", diags) \
            if "unroll" in fields else 1
        for up, low in zip(e.path, e.path[1:]):
            if not _edge_ends(up, low, problem_asts, diags):
                continue
            if (up.name, low.name) in links:
                diags.error("E205", f"the edge `{up.name} -> {low.name}` is declared twice", up.span.to(low.span),
                            notes=(f"first declared at {links[up.name, low.name].span}",),
                            help="merge the two declarations")
                continue
            links[up.name, low.name] = Link(up.name, low.name, up.span.to(low.span))
            if method is None or unroll is INVALID:
                continue
            edge = HierarchyEdge(up.name, low.name, method, unroll, up.span.to(low.span))
            if low.name in by_name:
                checked = check_method(edge, by_name[low.name], diags)
                if checked is None:
                    continue
                edge = replace(edge, method=checked)
            edges[up.name, low.name] = edge
    return tuple(edges.values()), tuple(links.values())


def _edge_ends(up: ast.Ident, low: ast.Ident, problem_asts: dict, diags: Diagnostics) -> bool:
    ok = True
    for end in (up, low):
        if end.name not in problem_asts:
            diags.error("E208", f"no problem named `{end.name}`", end.span, label="unknown problem",
                        help=did_you_mean(end.name, problem_asts) or "declare it with `problem NAME { ... }`")
            ok = False
    if ok and up.name == low.name:
        diags.error("E204", f"problem `{up.name}` cannot sit above itself", up.span.to(low.span),
                    help="a hierarchy edge joins an upper problem to a different, lower one")
        ok = False
    return ok


def _chain(c: ast.Chain, problem_asts: dict, diags: Diagnostics) -> ChainSpec | None:
    owner = "a chain"
    fields = _fields(c.body, V.CHAIN_FIELDS, owner, diags) if c.body else {}
    missing = _missing(fields, V.CHAIN_FIELDS, owner, c.span, diags)
    ok = all(_known(s, problem_asts, diags) for s in c.stages)
    if len(c.stages) < 2:
        diags.error("E501", "an interlocking chain needs at least two stages", c.span,
                    help="list the depthwise modules in order, e.g. `chain [stage1, stage2]`")
        return None
    if missing or not ok:
        return None
    n = V.CHAIN_FIELDS["interlock"].type.check(fields["interlock"].value, "`interlock`", diags)
    if n is INVALID:
        return None
    if not 1 <= n <= len(c.stages):
        diags.error("E502", f"`interlock` must be between 1 and {len(c.stages)} for a chain of "
                    f"{len(c.stages)} stages, got {n}", fields["interlock"].value.span,
                    help=f"1 is local learning, 2 pairwise, {len(c.stages)} end-to-end backpropagation")
        return None
    return ChainSpec(tuple(s.name for s in c.stages), n, c.span)


def _known(ident: ast.Ident, problem_asts: dict, diags: Diagnostics) -> bool:
    if ident.name in problem_asts:
        return True
    diags.error("E208", f"no problem named `{ident.name}`", ident.span, label="unknown problem",
                help=did_you_mean(ident.name, problem_asts))
    return False


def _train(module: ast.Module, scope: Scope, diags: Diagnostics) -> TrainSpec:
    blocks = module.of_type(ast.Train)
    for extra in blocks[1:]:
        diags.error("E602", "a program has one `train` block, but this is a second", extra.span,
                    help="merge it into the first")
    if not blocks:
        return TrainSpec()
    block = blocks[0]
    fields = _fields(block.body, V.TRAIN_FIELDS, "the train block", diags, allow_every=True)
    _missing(fields, V.TRAIN_FIELDS, "the train block", block.span, diags)
    values = {k: _value(f, V.TRAIN_FIELDS[k], scope, f"`{k}`", diags) for k, f in fields.items()}
    values = {k: v for k, v in values.items() if v is not INVALID}
    every = _every(block.body, scope, diags)
    return TrainSpec(**values, **every, span=block.span)


def _every(block: ast.Block, scope: Scope, diags: Diagnostics) -> dict:
    out: dict = {"evals": []}
    for e in (x for x in block.entries if isinstance(x, ast.Every)):
        kind = e.kind.name
        if kind not in V.TRAIN_EVERY:
            diags.error("E601", f"unknown periodic action `{kind}`", e.kind.span,
                        help=did_you_mean(kind, V.TRAIN_EVERY) or "use eval, checkpoint or log")
            continue
        interval = Int(1).check(e.interval, f"the interval of `{kind}`", diags)
        if kind == "eval":
            if e.value is None:
                diags.error("E310", "`eval every N` needs the evaluation to call", e.span,
                            help="write `eval every 500 = lib.accuracy(model, lib.test_data())`")
                continue
            call = resolve_pycall(e.value, "an evaluation", scope, diags, problems=True, batch=False)
            if call is not None and interval is not INVALID:
                out["evals"].append(EvalSpec(interval, call))
        elif e.value is not None:
            diags.error("E304", f"`{kind} every N` takes no value", e.value.span,
                        help=f"write `{kind} every N`")
        elif interval is not INVALID:
            out[f"{kind}_every"] = interval
    out["evals"] = tuple(out["evals"])
    return out


def _settings(module: ast.Module, diags: Diagnostics) -> str:
    fields = _fields(ast.Block(module.of_type(ast.Setting), module.span), V.SETTINGS,
                     "the program", diags, unknown="E214")
    semantics = "exact"
    if "semantics" in fields:
        value = V.SETTINGS["semantics"].type.check(fields["semantics"].value, "`semantics`", diags)
        semantics = semantics if value is INVALID else value
    return semantics
