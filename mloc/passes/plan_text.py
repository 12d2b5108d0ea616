"""The plan as text: `mloc plan`'s table (`plan_table`) and its JSON (`plan_to_json`)."""

from __future__ import annotations

from mloc.passes.schedule import Loop, compile_lines, schedule_json, schedule_lines

# The plan's types (`mloc.passes.plan.Plan`, `EdgePlan`; `Composition`, `Interlock`) are not
# imported: `mloc.passes.plan` imports this module.


def format_bytes(n: int | None) -> str:
    """`12.3 MiB`, `4.0 KiB`, or `unknown`."""
    if n is None:
        return "unknown"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"



def plan_to_json(plan) -> dict:
    return {
        "semantics": {"asked": plan.semantics, "runtime": plan.runtime_semantics, "reason": plan.semantics_reason},
        "memory_budget": plan.memory_budget,
        "edges": [{"upper": e.upper, "lower": e.lower, "method": e.method, "args": dict(e.args),
                   "unroll": e.unroll, "time_g": e.time_g, "memory_bytes": e.memory,
                   "compiled_memory_bytes": e.compiled_memory, "reason": e.reason}
                  for e in plan.edges],
        "composition_order": list(plan.order),
        "compositions": {top: _composition_json(c) for top, c in plan.compositions.items()},
        "periods": dict(sorted(plan.periods.items())),
        "schedule": schedule_json(plan.schedule),
        "warmup": [{"action": a.kind, "problem": a.problem, "count": a.count} for a in plan.warmup],
        **({"chains": [_chain_json(c) for c in plan.chains]} if plan.chains else {}),
        **({"recompute": {"on": plan.recompute[0], "reason": plan.recompute[1]}} if plan.recompute else {}),
    }


def _chain_json(c) -> dict:
    return {"stages": list(c.stages), "interlock": c.n, "policy": c.policy(),
            "trained_by": {s: c.stages[c.target(k)] for k, s in enumerate(c.stages)},
            "pruned_heads": [c.stages[t] for t in c.pruned()], "monitor": c.monitor}


def _composition_json(c) -> dict:
    return {"down": list(c.down), "up": [[n, list(t), out] for n, t, out in c.up],
            "seeds": list(c.seeds), "nested": [[m, [[n, list(t), out] for n, t, out in up], list(b)]
                                               for m, up, b in c.nested],
            "live_seeds": c.live_seeds, "shape": c.shape}


def plan_table(plan) -> str:
    """A plain-text table: one row per edge, then the semantics and the schedule. A program
    without hierarchy edges (only interlocking chains, or one problem) has no hypergradient
    to plan: no methods, semantics, budget or composition order, so it says that instead."""
    lines = _edge_lines(plan) if plan.edges else [
        "no hierarchy edges: " + ("the problems train in interlocking chains" if plan.chains else
                                  "each problem trains on its own loss")
        + ", so no hypergradient is computed (no method, semantics or composition order applies)"]
    if plan.warmup:
        lines.append("before the first outer step:")
        lines += schedule_lines(Loop(1, plan.warmup), 1)
    for c in plan.chains:
        lines.append(f"chain [{', '.join(c.stages)}], interlock = {c.n} ({c.policy()}):")
        lines += [f"  {line}" for line in c.lines()]
    lines.append("schedule, one outer step:")
    lines += schedule_lines(plan.schedule, 1)
    lines += compile_lines(plan.schedule)
    lines += plan.sync
    return "\n".join(lines) + "\n"


def _edge_lines(plan) -> list[str]:
    """The edges' table, the semantics, the memory budget and the composition order."""
    shown = plan.compile != "off"     # the compiled estimate, where the steps may be compiled
    rows = [("edge", "method", "mode", "memory", *(("compiled",) if shown else ()), "time (G)", "reason")]
    for e in plan.edges:
        rows.append((f"{e.upper} -> {e.lower}", e.render().split("(")[0] + _args_text(e), e.mode or "-",
                     format_bytes(e.memory), *((format_bytes(e.compiled_memory),) if shown else ()),
                     f"{e.time_g:g}", e.reason))
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:n], widths)) + "  " + r[n] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    lines.append("")
    if any(e.memory is not None for e in plan.edges):
        lines.append("memory: estimated peak of the upper's hypergradient step, from sizes measured on the meta "
                     "device; within 1.5x of measured on the examples (docs/runtime.md)")
        if shown:
            lines.append("compiled: the same step compiled (--compile on, or auto once it compiles), the lower's "
                         "graphs as TorchInductor's buffers hold them; against the allocator's measurement in docs/runtime.md")
    lines.append(f"semantics: {plan.runtime_semantics} ({plan.semantics_reason})")
    held = " (held against the compiled estimates: --compile on)" if plan.compile == "on" and plan.memory_budget \
        else ""
    lines.append(f"memory budget: {format_bytes(plan.memory_budget) if plan.memory_budget else 'none'}{held}")
    if plan.recompute:
        lines.append(f"activation checkpointing: {plan.recompute[1]}")
    lines.append("composition order (adjoints, bottom-up): " + " -> ".join(plan.order))
    return lines


def _args_text(e) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in e.args if v is not None and k != "mode")
    return f"({inner})" if inner else ""
