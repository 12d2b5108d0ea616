"""Printers for the program graph: text (golden files), DOT, Mermaid and JSON.

All of them walk the graph's deterministic accessors, so equal programs print equal bytes.
"""

from __future__ import annotations

import json

from mloc.ir.graph import ProgramGraph
from mloc.ir.interlock import chains_of
from mloc.ir.payloads import Builtin, ProblemNode


def _loc(span) -> str:
    return f"{span.line}:{span.col}"


def _problem_lines(p: ProblemNode) -> list[str]:
    lines = [f"problem {p.name}  # {_loc(p.span)}",
             f"  module    = {p.module.text}",
             f"  data      = {p.data.text}",
             f"  loss      = {p.loss.text}",
             f"  reads     = [{', '.join(p.loss.read_names())}]",
             f"  optimizer = {p.optimizer.render()}"]
    optional = {"trainable": p.trainable if p.trainable != ("*",) else None, "frozen": p.frozen or None,
                "meta_trainable": p.meta_trainable, "init": p.init[0] if p.init else None,
                "clip_grad_norm": p.clip_grad_norm, "precision": p.precision,
                "schedule": p.schedule.render() if isinstance(p.schedule, Builtin) else None}
    lines += [f"  {k:<9} = {v if isinstance(v, str) else repr(v)}"
              for k, v in optional.items() if v is not None]
    return lines


def dump_text(g: ProgramGraph) -> str:
    info = g.info
    out = [f"program {info.name}", f"semantics {info.semantics}"]
    out += [f"import {i.module} as {i.bound}" for i in info.imports]
    levels = g.levels()
    for p in g.problems():
        out += _problem_lines(p)
        out.append(f"  level     = {levels[p.name]}")
    for e in g.hierarchy_edges():
        out.append(f"hierarchy {e.upper} -> {e.lower}  unroll={e.unroll} hypergrad={e.method.render()}  # {_loc(e.span)}")
    for d in g.dataflow_edges():
        out.append(f"dataflow  {d.src} -> {d.dst}  {d.kind} via {d.via}  # {_loc(d.span)}")
    for c, il in zip(info.chains, chains_of(g)):
        out.append(f"chain [{', '.join(c.stages)}] interlock={c.interlock}  # {_loc(c.span)}")
        out += [f"  {line}" for line in il.lines()]
    t = info.train
    out.append(f"train steps={t.steps} seed={t.seed} device={t.device} precision={t.precision} "
               f"memory_budget={t.memory_budget} log_every={t.log_every} checkpoint_every={t.checkpoint_every}"
               + (f" strategy={t.strategy}" if t.strategy != "auto" else "")
               + (f" checkpoint_form={t.checkpoint_form}" if t.checkpoint_form != "gathered" else ""))
    out += [f"  eval {e.name} every {e.every} = {e.call.text}" + ("" if e.named else "  # named after the function")
            for e in t.evals]
    if t.best is not None:
        out.append(f"  checkpoint best on {t.best.mode} {t.best.metric}")
    if t.stop is not None:
        out.append(f"  stop when {t.stop.mode} {t.stop.metric} has not improved by {t.stop.min_delta!r} "
                   f"for {t.stop.patience} evals")
    return "\n".join(out) + "\n"


def _label(p: ProblemNode, level: int) -> str:
    return f"{p.name}\\n{p.optimizer.name} · level {level}"


def dump_dot(g: ProgramGraph) -> str:
    levels = g.levels()
    out = [f'digraph "{g.info.name}" {{', "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=10];']
    for p in g.problems():
        out.append(f'  "{p.name}" [label="{_label(p, levels[p.name])}"];')
    for e in g.hierarchy_edges():
        out.append(f'  "{e.upper}" -> "{e.lower}" [label="{e.method.name} ×{e.unroll}", penwidth=2];')
    for d in g.dataflow_edges():
        style = {"u2l": "dashed", "l2u": "dotted", "chain": "bold"}[d.kind]
        out.append(f'  "{d.src}" -> "{d.dst}" [label="{d.kind}", style={style}, color="#777777", constraint=false];')
    out.append("}")
    return "\n".join(out) + "\n"


def dump_mermaid(g: ProgramGraph) -> str:
    levels = g.levels()
    out = ["flowchart TB"]
    for p in g.problems():
        out.append(f'  {p.name}["{p.name}<br/>{p.optimizer.name} · level {levels[p.name]}"]')
    for e in g.hierarchy_edges():
        out.append(f"  {e.upper} ==>|{e.method.name} ×{e.unroll}| {e.lower}")
    for d in g.dataflow_edges():
        out.append(f"  {d.src} -.->|{d.kind}| {d.dst}")
    return "\n".join(out) + "\n"


def to_json(g: ProgramGraph) -> dict:
    levels = g.levels()
    return {
        "program": g.info.name,
        "semantics": g.info.semantics,
        "problems": [{"name": p.name, "level": levels[p.name], "line": p.span.line,
                      "optimizer": {"name": p.optimizer.name, "args": dict(p.optimizer.args)},
                      "module": p.module.text, "data": p.data.text, "loss": p.loss.text,
                      "reads": list(p.loss.read_names()), "init": p.init[0] if p.init else None}
                     for p in g.problems()],
        "hierarchy": [{"upper": e.upper, "lower": e.lower, "unroll": e.unroll,
                       "method": {"name": e.method.name, "args": dict(e.method.args)}, "line": e.span.line}
                      for e in g.hierarchy_edges()],
        "dataflow": [{"src": d.src, "dst": d.dst, "kind": d.kind, "via": d.via, "line": d.span.line}
                     for d in g.dataflow_edges()],
        "chains": [{"stages": list(c.stages), "interlock": c.n,
                    "trained_by": {s: c.stages[c.target(k)] for k, s in enumerate(c.stages)},
                    "pruned_heads": [c.stages[t] for t in c.pruned()]} for c in chains_of(g)],
    }


def dump_json(g: ProgramGraph) -> str:
    return json.dumps(to_json(g), indent=2, sort_keys=True) + "\n"


FORMATS = {"text": dump_text, "dot": dump_dot, "mermaid": dump_mermaid, "json": dump_json}


def with_plan(text: str, fmt: str, labels: dict[tuple[str, str], str]) -> str:
    """Annotate a dump's hierarchy edges with the planner's decisions (`mloc graph --plan`).

    `labels` maps (upper, lower) to a short text such as "sama(eps=0.01), 0.5 MiB"."""
    import re

    if fmt == "text":
        extra = [f"plan      {u} -> {l}  {t}" for (u, l), t in sorted(labels.items())]
        return text + "\n".join(extra) + "\n"
    if fmt == "dot":
        for (u, l), t in labels.items():
            text = re.sub(rf'("{u}" -> "{l}" \[label=")[^"]*(", penwidth=2\])', rf"\g<1>{t}\2", text)
        return text
    if fmt == "mermaid":
        for (u, l), t in labels.items():
            text = re.sub(rf"(  {u} ==>\|)[^|]*(\| {l})", rf"\g<1>{t}\2", text)
        return text
    return text
