"""The resolve pass: the parsed file -> checked problems, edges and program settings.

Reports every independent error at once: missing/duplicate `program`, imports that cannot be
found, duplicate problems, unknown/missing/duplicate fields, names, built-in calls and their
arguments, methods that cannot handle the lower problem's optimizer, chains and the train
block. Graph-level facts (cycles, orphans, dataflow) are checked by later passes on the
declared structure this pass also returns.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mloc.builtins import METHODS
from mloc.diagnostics import Diagnostics, closest, did_you_mean
from mloc.frontend import ast
from mloc.ir.payloads import (HierarchyEdge, ImportSpec, Link, ProblemNode, ProgramInfo, Read,
                              ResolvedProgram)
from mloc.lang import vocabulary as V
from mloc.lang.types import INVALID
from mloc.passes.blocks import resolve_chains, resolve_settings, resolve_train
from mloc.passes.builtins import bind_builtin
from mloc.passes.fields import check_value, index_fields, report_missing
from mloc.passes.methods import check_method
from mloc.passes.names import Scope
from mloc.passes.pymodules import PyModuleInfo, find_module, first_broken
from mloc.source import SourceFile

KEYWORDS = frozenset({"program", "import", "as", "problem", "chain", "train", "every", "true",
                      "false", "True", "False", "batch"})


def resolve(module: ast.Module, src: SourceFile, diags: Diagnostics) -> ResolvedProgram:
    name = _program_name(module, src, diags)
    scope = Scope(_imports(module, src, diags), set(), set(), src.directory)
    problem_asts = _unique_problems(module, diags)
    scope.problems.update(problem_asts)
    problems, reads, loss_spans = [], [], {}
    for i, a in enumerate(problem_asts.values()):
        node, node_reads, loss_span = _problem(a, i, scope, diags)
        problems += [node] if node else []
        if node_reads is not None:
            reads += node_reads
            loss_spans[a.name.name] = loss_span
    edges, links, uncertain = _edges(module, problem_asts, {p.name: p for p in problems}, diags)
    _check_restarts(problems, edges, _warmup_spans(module), diags)
    chains, groups, broken_stages = resolve_chains(module, set(problem_asts), diags)
    info = ProgramInfo(name, src.path, (), resolve_settings(module, diags),
                       resolve_train(module, scope, diags), chains)
    info = replace(info, imports=_import_specs(module, scope, diags))
    return ResolvedProgram(info, tuple(problems), edges, tuple(problem_asts),
                           tuple(a.name.span for a in problem_asts.values()), links, tuple(reads),
                           frozenset(loss_spans), loss_spans, groups,
                           frozenset(uncertain | broken_stages), _program_span(module, src))


def _import_specs(module: ast.Module, scope: Scope, diags: Diagnostics) -> tuple[ImportSpec, ...]:
    for imp in module.of_type(ast.Import):
        if imp.bound not in scope.used_imports and scope.imports.get(imp.bound) is not None:
            diags.warn("W101", f"`{imp.bound}` is imported but never used", imp.span,
                       help="remove the import")
    return tuple(ImportSpec(i.module.dotted, i.bound, _path(scope, i.bound), i.span)
                 for i in module.of_type(ast.Import))


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
            where = "/".join(imp.module.parts) + ".py"
            diags.error("E105", f"cannot find the Python module `{imp.module.dotted}`",
                        imp.module.span, label="not found",
                        help=f"put `{where}` beside {src.path}, or install the package that provides it")
        elif (broken := first_broken(info, src.directory)) is not None:
            _report_broken(imp, *broken, src, diags)
        bound[imp.bound] = info
    return bound


def _report_broken(imp: ast.Import, info: PyModuleInfo, via: tuple[tuple[str, int], ...],
                   src: SourceFile, diags: Diagnostics) -> None:
    """E109 at the place in the module where Python's parser stops (the imported module, or
    one of the user's modules it imports, `via` those imports), named as the user reaches it."""
    bad = info.broken
    shown = module_path(info.path, src)
    text = SourceFile(shown, bad.text)
    start = text.offset_of(bad.line, bad.col)
    span = text.span(start, max(start + 1, text.offset_of(bad.end_line, bad.end_col) + 1))
    chain = "".join(f"{module_path(f, src)}:{line}, imported by " for f, line in reversed(via))
    fix = "split the expression that nests or chains too deeply" if bad.whole else "fix the syntax"
    diags.error("E109", f"the Python module `{info.dotted}` does not parse: {bad.message}", span,
                label="Python gives up on this module" if bad.whole else "Python stops here",
                notes=(f"imported at {chain}{imp.span}",),
                help=f"{fix} in {shown}; `python -m py_compile {shown}` shows the same error")


def module_path(path: str | Path, src: SourceFile) -> str:
    """A module's file as the user reaches it: one beside the `.mlo` file under the path the
    `.mlo` file was given by (`progs/lib.py` for `progs/x.mlo`), another as it is."""
    try:
        return str(Path(src.path).parent / Path(path).relative_to(src.directory))
    except ValueError:
        return str(path)


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


def _problem(p: ast.Problem, order: int, scope: Scope, diags: Diagnostics):
    """The problem's node (None if any field is wrong), its reads and its loss's span (both
    None when the loss or init could not be resolved)."""
    name = p.name.name
    owner = f"problem `{name}`"
    fields = index_fields(p.body, V.PROBLEM_FIELDS, owner, diags)
    missing = report_missing(fields, V.PROBLEM_FIELDS, owner, p.name.span, diags)
    values = {k: check_value(f, V.PROBLEM_FIELDS[k], scope, f"`{k}` of `{name}`", diags)
              for k, f in fields.items()}
    reads = _reads(name, values) if "loss" in fields else None
    loss_span = values["loss"].span if reads is not None else None
    if values.get("project") not in (None, INVALID):
        _check_acts_alone(name, values, "project", "E215", "lib.clamp", diags)
    if values.get("reinit") not in (None, False, INVALID):
        _check_acts_alone(name, values, "reinit", "E216", "lib.reset", diags)
    if missing or INVALID in values.values():
        return None, reads, loss_span
    if "vmap" in values:    # kept as where it is written (a span is true), for E219
        values["vmap"] = fields["vmap"].value.span if values["vmap"] else None
    node = ProblemNode(name=name, span=p.span, name_span=p.name.span, order=order, **values)
    return node, reads, loss_span


def _check_acts_alone(name: str, values: dict, key: str, code: str, example: str,
                      diags: Diagnostics) -> None:
    """`project` and `reinit` act on the problem's own module: a call names that problem and
    no other, and the problem trains its module's parameters directly (not through `init`)."""
    value = values[key]
    reads = value.reads if value is not True else ((name, None),)
    others = [(q, span) for q, span in reads if q != name]
    if others or not reads:
        q, span = others[0] if others else (None, value.span)
        diags.error(code, f"the `{key}` of `{name}` must act on `{name}` alone"
                    + (f", but it names `{q}`" if q else ", but it names no problem"), span,
                    help=f"pass `{name}` (its module) and nothing else, e.g. `{example}({name})`")
    elif values.get("init") not in (None, INVALID):
        why = ("a projection of them would be lost" if key == "project" else
               "it already starts again from them at each of its upper's steps")
        diags.error(code, f"`{name}` starts from `{values['init'][0]}` (`init`): its module's "
                    f"parameters are rebuilt from the upper's at every step, so {why}",
                    values["init"][1] if key == "reinit" else value.span,
                    help=f"drop `{key}` or drop `init`")


def _reads(name: str, values: dict) -> list[Read] | None:
    if values["loss"] is INVALID or values.get("init") is INVALID:
        return None
    reads = [Read(q, name, "loss", span) for q, span in values["loss"].reads]
    if values.get("init"):
        reads.append(Read(values["init"][0], name, "init", values["init"][1]))
    return reads


def _edges(module: ast.Module, problem_asts: dict, by_name: dict, diags: Diagnostics):
    edges: dict[tuple[str, str], HierarchyEdge] = {}
    links: dict[tuple[str, str], Link] = {}
    uncertain: set[str] = set()
    for e in module.of_type(ast.Edge):
        method, unroll, warmup = _edge_options(e, diags)
        for up, low in zip(e.path, e.path[1:]):
            if not _edge_ends(up, low, problem_asts, diags):
                # the known end, and the problem a misspelt end probably meant, are in limbo
                uncertain.update(x.name for x in (up, low))
                uncertain.update(closest(x.name, problem_asts) or x.name for x in (up, low))
                continue
            span = up.span.to(low.span)
            if (up.name, low.name) in links:
                diags.error("E205", f"the edge `{up.name} -> {low.name}` is declared twice", span,
                            notes=(f"first declared at {links[up.name, low.name].span}",),
                            help="merge the two declarations")
                continue
            links[up.name, low.name] = Link(up.name, low.name, span)
            if method is None or unroll is INVALID:
                continue
            edge = HierarchyEdge(up.name, low.name, method, unroll, span, warmup)
            if low.name in by_name:
                checked = check_method(edge, by_name[low.name], diags)
                if checked is None:
                    continue
                edge = replace(edge, method=checked)
            edges[up.name, low.name] = edge
    return tuple(edges.values()), tuple(links.values()), uncertain


def _check_restarts(problems: list[ProblemNode], edges: tuple[HierarchyEdge, ...],
                    warmups: dict, diags: Diagnostics) -> None:
    """`reinit` restarts a lower problem at each step of its upper (E216 without one);
    `warmup` trains a lowest problem alone first (E217 for a problem with lowers, or one
    that starts again at every upper step anyway), reported at the `warmup` written."""
    by_name = {p.name: p for p in problems}
    uppers = {e.lower for e in edges}
    for p in problems:
        if p.reinit is not False and p.name not in uppers:
            span = p.reinit.span if p.reinit is not True else p.name_span
            diags.error("E216", f"`{p.name}` has no upper problem, so nothing marks when `reinit` "
                        "would start it again", span,
                        help=f"declare an edge `UPPER -> {p.name}`, or drop `reinit`")
    for e in edges:
        low = by_name.get(e.lower)
        if not e.warmup or low is None:
            continue
        if any(x.upper == e.lower for x in edges):
            why = f"`{e.lower}` has lower problems of its own, whose steps a warm-up would skip"
        elif low.init is not None or low.reinit is not False:
            why = f"`{e.lower}` starts again at every step of `{e.upper}` (`init`/`reinit`), undoing it"
        else:
            continue
        diags.error("E217", f"`warmup` cannot apply to `{e.upper} -> {e.lower}`: {why}",
                    warmups.get((e.upper, e.lower), e.span), help="drop `warmup` from this edge")


def _warmup_spans(module: ast.Module) -> dict:
    """{(upper, lower): the span of the `warmup` key} of every edge that writes one."""
    out = {}
    for e in module.of_type(ast.Edge):
        for f in e.body.entries if e.body else ():
            if isinstance(f, ast.Field) and f.key.name == "warmup":
                out.update({(u.name, l.name): f.key.span for u, l in zip(e.path, e.path[1:])})
    return out


def _edge_options(e: ast.Edge, diags: Diagnostics):
    fields = index_fields(e.body, V.EDGE_FIELDS, "a hierarchy edge", diags) if e.body else {}
    method_value = fields["hypergrad"].value if "hypergrad" in fields else ast.Name(("auto",), e.span)
    method = bind_builtin(method_value, METHODS, "methods", diags)
    unroll = V.EDGE_FIELDS["unroll"].type.check(fields["unroll"].value, "`unroll`", diags) \
        if "unroll" in fields else 1
    warmup = V.EDGE_FIELDS["warmup"].type.check(fields["warmup"].value, "`warmup`", diags) \
        if "warmup" in fields else 0
    return method, unroll, (0 if warmup is INVALID else warmup)


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
