"""What data parallelism synchronises in one outer step: the plan's `--nproc` lines.

Under `--nproc N` a gradient is averaged across the N replicas wherever the step is not
linear in the replicas' batches (:mod:`mloc.runtime.base.overlap` averages each as its
backward runs: a *synchronised backward*, one collective per 25 MiB bucket). Per step kind:

- a plain step (`lower_step`, or `commit`: an unrolled step taken for real), an optimizer
  step on accumulated micro-steps (`apply`), each stage of an interlocking step: its
  gradient, 1;
- an upper step: the upper's gradient that seeds the adjoints (1, unless every edge below
  has no indirect term), what each lower's BR-VJP averages (`SyncCaps` in the method's
  descriptor: cg's and neumann's Hessian-vector products, SAMA's lower gradient over an
  optimizer whose diagonal reads it), and the final hypergradient, 1;
- a micro-step of `accumulate`: the upper step's count less its final backward (the sum is
  averaged once, at `apply`).

These are the fewest that give each replica the numbers one process with the whole batch
computes: every one feeds a non-linear step (a solve, a normalised finite difference, an
optimizer). SAMA's paper counts one (its last backward) because it does not average the
upper's gradient before the finite difference; mloc does, so `--nproc 2` equals one process
with the combined batch. A meta-batch under `--nproc` and the nested passes of `exact`
semantics are not counted (said so).
"""

from __future__ import annotations

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.ir.graph import ProgramGraph
from mloc.passes.schedule import Loop
from mloc.shared.composition import Composition
from mloc.shared.strategy import decide


def sync_lines(g: ProgramGraph, edges, schedule: Loop, compositions: dict[str, Composition],
               sizes=None) -> tuple[str, ...]:
    """The plan's lines: the synchronised backwards of one outer step, per step of the
    schedule, then the strategy (:func:`strategy_line`)."""
    per_upper = {top: _upper(g, edges, c) for top, c in compositions.items()}
    rows, total, uncounted = [], 0, []
    for kind, problem, times in _actions(schedule, 1):
        n, why = _of(kind, problem, per_upper, g)
        if n is None:
            uncounted.append(f"{kind} {problem}")
            continue
        if n == 0:
            continue
        total += n * times
        x = f" x{times}" if times > 1 else ""
        rows.append(f"  {kind} {problem}{x}: {n} ({why})")
    head = (f"data parallel (--nproc N): {total} synchronised backward{'s' * (total != 1)} per outer step "
            "(averaged in 25 MiB buckets as each runs; --overlap off: after it)")
    tail = [f"  not counted: {', '.join(uncounted)}"] if uncounted else []
    return (head, *rows, *tail, strategy_line(g, sizes))


def strategy_line(g: ProgramGraph, sizes) -> str:
    """The strategy under `--nproc N > 1` (`mloc.shared.strategy.decide`, the rule the runtime
    applies to the sizes it measures) from the parameters the dataflow pass measured and
    their optimizers' state (:func:`state_floats`); unknown sizes without them."""
    asked = g.info.train.strategy
    measured = sizes is not None and all(n in sizes.params for n in g.names())
    params = sum(sizes.params[n] for n in g.names()) * sizes.element_bytes if measured else None
    state = sum(state_floats(g, n) * sizes.params[n] for n in g.names()) * sizes.element_bytes if measured else None
    chosen, why = decide(asked, 2, params, state)
    return f"strategy under --nproc N > 1: {chosen} ({why}; one process: ddp)"


def state_floats(g: ProgramGraph, name: str) -> int:
    """Floats of optimizer state per trained parameter of problem `name`: its optimizer's
    `state_per_param` (at most), but none for SGD without momentum (no buffer is made;
    unless a schedule, which may cycle a momentum in, drives it)."""
    p = g.problem(name)
    if p.optimizer.name == "sgd" and dict(p.optimizer.args).get("momentum") == 0 and p.schedule is None:
        return 0
    return OPTIMIZERS[p.optimizer.name].caps.state_per_param


def _actions(loop: Loop, times: int):
    for item in loop.body:
        if isinstance(item, Loop):
            yield from _actions(item, times * item.repeat)
        else:
            yield item.kind, item.problem, times * item.count


def _of(kind: str, problem: str, per_upper: dict, g: ProgramGraph) -> tuple[int | None, str]:
    if kind in ("lower_step", "apply", "commit"):
        return 1, "its gradient"
    if kind == "chain_step":
        stages = next((len(c.stages) for c in _chains(g) if c.stages[0] == problem), 1)
        return stages, "each stage's gradient"
    if kind in ("upper_step", "accumulate") and problem in per_upper:
        n, parts, exact = per_upper[problem]
        if n is None or not exact:
            return None, ""
        if kind == "accumulate":
            return n - 1, "; ".join(parts[:-1]) or "nothing"
        return n, "; ".join(parts)
    if kind in ("upper_step", "accumulate", "meta_batch"):
        return None, ""
    return 0, ""


def _chains(g: ProgramGraph):
    from mloc.ir.interlock import chains_of
    return chains_of(g)


def _upper(g: ProgramGraph, edges, c: Composition) -> tuple[int | None, list[str], bool]:
    """An upper step's synchronised backwards, what each averages, and whether the count is exact."""
    by_lower = {e.lower: e for e in edges}
    parts = ["the upper's gradient"] if c.seeds else []
    n, methods = len(parts), [by_lower[d].method for d in c.down if d in by_lower]
    for name, _, _ in c.up:
        e = by_lower.get(name)
        if e is None:
            return None, [], False
        d = METHODS[e.method]
        args = {p.name: p.default for p in d.signature.params} | {k: v for k, v in e.args if v is not None}
        reads = OPTIMIZERS[g.problem(e.lower).optimizer.name].caps
        k, what = d.caps.sync.count(args, getattr(reads, "diag_reads_grad", False))
        n += k
        parts += list(what)
    parts.append("the hypergradient")
    if methods:
        parts[0] = f"{', '.join(dict.fromkeys(methods))}: {parts[0]}"
    return n + 1, parts, not c.nested
