"""The planner: how to train the program the graph describes. Every decision has a reason.

For each hierarchy edge, the best-response method (the user's, or `auto`'s choice under
the memory budget) and, for unrolled differentiation, its mode; the semantics handed to
the runtime; the order in which BR-VJPs are composed; and the step schedule (who steps
when). Costs are in G, one forward+backward of the lower problem's loss, with a
Hessian-vector product counted as 2 G (Pearlmutter); memory in bytes, from the parameter
and activation sizes the dataflow pass measured (`Sizes`), when it ran. Each method's
cost is its descriptor's (`mloc.builtins.methods`, where the table of costs is); `auto`
has none: it is resolved here into a method that has one.

Without a memory budget the fastest `itd` mode wins (reverse). Under a budget that rules out
reverse mode's T graphs, the fastest mode that fits: usually recompute (about 2√T iterates),
forward mode (d×m tangents, flat in T) where those do not fit either and the upper problem
has few parameters, or where it is the faster of the two. The lower optimizer's state at
rest (`state_per_param` floats per parameter; none for SGD without momentum) is reported
per edge as `state_memory`, apart from `memory`, the step's peak, which the decisions read
(the copies of the state that recompute's iterates and forward's tangents hold are in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mloc.builtins import METHODS, OPTIMIZERS, Shape
from mloc.builtins.methods import ITD
from mloc.ir.composition import compose_all, feedback, step_caps
from mloc.ir.graph import ProgramGraph
from mloc.ir.interlock import chains_of
from mloc.ir.payloads import HierarchyEdge
from mloc.passes.parallel import state_floats as _state_floats, sync_lines
from mloc.passes.plan_text import format_bytes, plan_table, plan_to_json  # noqa: F401 (re-exported)
from mloc.passes.recompute import decide as recompute_decision
from mloc.passes.schedule import Action, Loop, periods_of, schedule_of
from mloc.shared.composition import Composition
from mloc.shared.interlock import Interlock
from mloc.shared.unroll import checkpoints, segment_length


@dataclass(frozen=True)
class Sizes:
    """Measured by the dataflow pass, per problem: trainable parameters; the bytes one
    forward of its loss keeps for the backward (activations); the bytes the graph of its
    own gradient keeps (``create_graph=True``, activations included: one Hessian-vector
    product's or one unrolled step's graph); its batch's bytes. And bytes per element.
    (`mloc.runtime.grad.introspect.probe_loss` measures them on the meta device.)"""

    params: dict[str, int] = field(default_factory=dict)
    activations: dict[str, int] = field(default_factory=dict)
    element_bytes: int = 4
    graphs: dict[str, int] = field(default_factory=dict)
    hvps: dict[str, int] = field(default_factory=dict)
    backwards: dict[str, int] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    fx_ops: dict[str, int] = field(default_factory=dict)     # aten operations in each loss
    fx_code: dict[str, str] = field(default_factory=dict)    # each loss as torch.fx traced it
    # per problem, its `activations`, `graph`, `hvp` and `backward` as a compiled step holds them
    # (`mloc.runtime.base.inductor_memory`: Inductor's buffers replayed over the traced graphs)
    compiled: dict[str, dict[str, int]] = field(default_factory=dict)
    is_compiled: bool = False       # these are the compiled sizes (`as_compiled`)

    def as_compiled(self) -> "Sizes":
        """These sizes with the compiled step's in place of the eager ones, where measured."""
        def pick(eager: dict, key: str) -> dict:
            return {**eager, **{n: c[key] for n, c in self.compiled.items() if key in c}}
        return replace(self, activations=pick(self.activations, "activations"), graphs=pick(self.graphs, "graph"),
                       hvps=pick(self.hvps, "hvp"), backwards=pick(self.backwards, "backward"), is_compiled=True)


@dataclass(frozen=True)
class EdgePlan:
    upper: str
    lower: str
    method: str
    args: tuple[tuple[str, object], ...]
    unroll: int
    time_g: float
    memory: int | None
    reason: str
    state_memory: int | None = None     # the lower optimizer's state, bytes (not in `memory`)
    compiled_memory: int | None = None  # `memory` when the step is compiled (`--compile on`)

    def render(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args if v is not None)
        return f"{self.method}({inner})" if inner else self.method

    @property
    def mode(self) -> str | None:
        return dict(self.args).get("mode")


@dataclass(frozen=True)
class Plan:
    semantics: str              # what the program asked for
    runtime_semantics: str      # what the runtime is given
    semantics_reason: str
    edges: tuple[EdgePlan, ...]
    order: tuple[str, ...]      # BR-VJP composition order (adjoint accumulation, bottom-up)
    periods: dict[str, int]     # lowest-level steps per step of each problem
    schedule: Loop
    memory_budget: int | None
    problems: tuple[str, ...]
    # each upper's BR-VJP composition and step shape: what the runtime executes
    compositions: dict[str, Composition] = field(default_factory=dict)
    warmup: tuple[Action, ...] = ()   # before the first outer step: lowers training alone
    chains: tuple[Interlock, ...] = ()  # interlocking chains: which head's loss trains each stage
    sync: tuple[str, ...] = ()          # what `--nproc` synchronises per outer step (passes.parallel)
    recompute: tuple[bool, str] | None = None   # activation checkpointing and why (passes.recompute)
    compile: str = "auto"               # `--compile`: under `on` the budget holds the compiled estimates

    def edge(self, upper: str, lower: str) -> EdgePlan:
        return next(e for e in self.edges if (e.upper, e.lower) == (upper, lower))


def plan_program(g: ProgramGraph, sizes: Sizes | None = None, compile: str = "auto") -> Plan:
    """The plan (module docstring). Each edge is priced twice, its step run eagerly
    (`EdgePlan.memory`) and compiled (`compiled_memory`); the budget is held against the
    compiled estimate under ``compile = "on"`` (every step compiled from the first), else
    against the eager one (`off`, and `auto`, whose first steps run eagerly)."""
    sizes = sizes or Sizes()
    compiled = compile == "on"
    pricing, other = (sizes.as_compiled(), sizes) if compiled else (sizes, sizes.as_compiled())
    budget = g.info.train.memory_budget
    semantics, reason = _semantics(g)
    # bottom-up, so that a middle's edges are priced with the differentiable passes below it
    middles = feedback(*structure(g)) if semantics == "exact" else {}
    rank = {n: i for i, n in enumerate(reversed(g.topological_order()))}
    planned: dict[tuple[str, str], EdgePlan] = {}
    for e in sorted(g.hierarchy_edges(), key=lambda e: rank[e.lower]):
        nested = _nested(g, e.lower, planned, pricing) if e.lower in middles else 0
        p = _plan_edge(g, e, pricing, budget, semantics, nested)
        alt = _cost(g, p.method, dict(p.args), other, e.lower, e.upper,
                    _nested(g, e.lower, planned, other) if e.lower in middles else 0)[1]
        p = replace(p, memory=alt, compiled_memory=p.memory) if compiled else \
            replace(p, compiled_memory=alt if compile != "off" else None)
        planned[e.upper, e.lower] = _with_state(g, p, sizes)
    edges = tuple(planned[e.upper, e.lower] for e in g.hierarchy_edges())
    periods = periods_of(g, edges)
    schedule = schedule_of(g, edges, periods)
    edges = _vectorized_memory(edges, schedule)
    order = tuple(reversed(g.topological_order()))
    warmup = tuple(Action("lower_step", e.lower, e.warmup, f"warm-up: `{e.lower}` trains alone first")
                   for e in g.hierarchy_edges() if e.warmup)
    compositions = compositions_of(g, edges, semantics)
    return Plan(g.info.semantics, semantics, reason, edges, order, periods, schedule, budget, g.names(),
                compositions, warmup, chains_of(g), sync_lines(g, edges, schedule, compositions, sizes),
                recompute_decision(edges, budget), compile)


# A vectorized meta-batch (`vmap = true`) holds every task's hypergradient step at once, each
# through torch.func's linearization rather than autograd's: measured 1.70-1.78 x one task's
# step per task on imaml.mlo (40 and 100 hidden units; 2, 4 and 8 tasks; 2, 5 and 10 inner
# steps: flat in them), `python3 bench/plan_memory.py`.
_VMAP_PER_TASK = 1.75


def _vectorized_memory(edges: tuple[EdgePlan, ...], schedule: Loop) -> tuple[EdgePlan, ...]:
    """Each edge whose upper steps as one vectorized meta-batch of k tasks: its memory that
    of the k tasks' steps at once (the decisions were taken per task; a budget is reported
    against the whole)."""
    tasks: dict[str, int] = {}
    stack = [schedule]
    while stack:
        node = stack.pop()
        if isinstance(node, Loop):
            stack.extend(node.body)
        elif node.kind == "meta_batch":
            tasks[node.problem] = node.count
    def times(n: int | None, k: int) -> int | None:
        return None if n is None else int(n * k * _VMAP_PER_TASK)
    return tuple(replace(e, memory=times(e.memory, tasks[e.upper]), compiled_memory=times(e.compiled_memory,
                                                                                           tasks[e.upper]))
                 if e.upper in tasks else e for e in edges)


def _semantics(g: ProgramGraph) -> tuple[str, str]:
    if g.info.semantics == "per_edge":
        return "per_edge", "asked for: Betty's per-edge implicit differentiation"
    reads, uppers = structure(g)
    middles = feedback(reads, uppers)
    if not middles:
        return "per_edge", "exact asked; no middle problem reads a lower one, so per-edge is exact and cheaper"
    m = next(iter(middles))
    low = next(r for r in reads[m] if r in middles[m])
    return "exact", f"`{m}` reads `{low}` below it: differentiate through its reduced objective"


def structure(g: ProgramGraph) -> tuple[dict, dict]:
    """Each problem's loss reads and its hierarchy uppers (what the compositions depend on)."""
    reads = {n: _runtime_reads(g, n) for n in g.names()}
    uppers: dict[str, set[str]] = {n: set() for n in g.names()}
    for e in g.hierarchy_edges():
        uppers[e.lower].add(e.upper)
    return reads, uppers


def _runtime_reads(g: ProgramGraph, name: str) -> tuple[str, ...]:
    """The problems `name`'s loss reads, then the `init` problems of those it reads (a
    problem started from another's weights is θ_init + δ: its loss reads θ_init too), as
    the runtime binds them (`mloc.runtime.program.build`)."""
    reads = tuple(g.problem(name).loss.read_names())
    inits = [g.problem(r).init[0] for r in reads if g.problem(r).init is not None]
    return reads + tuple(dict.fromkeys(i for i in inits if i not in reads))


def compositions_of(g: ProgramGraph, edges: tuple[EdgePlan, ...], semantics: str) -> dict:
    """Each upper's composition (`mloc.ir.composition`), from the planned methods."""
    reads, uppers = structure(g)
    caps = {e.lower: step_caps(e.method, dict(e.args)) for e in edges}
    try:
        return compose_all(reads, uppers, caps, feedback(reads, uppers) if semantics == "exact" else {})
    except ValueError:  # a simultaneous game under `exact`: the runtime reports it when built
        return {}


def _d(sizes: Sizes, name: str) -> int | None:
    return sizes.params.get(name)


def _cost(g: ProgramGraph, method: str, args: dict, sizes: Sizes, lower: str, upper: str,
          nested: int = 0, differentiable: bool = False) -> tuple[float, int | None]:
    """(time in G of one BR-VJP, memory in bytes of the upper's hypergradient step through it,
    or None): the method descriptor's cost, given the sizes the dataflow pass measured."""
    desc = METHODS[method]
    if desc.cost is None:
        raise ValueError(f"`{method}` has no cost: the planner resolves it to a method first")
    # the step evaluates the upper's loss unless nothing needs its partials: a first-order
    # lower (no indirect term) and an upper whose loss does not read itself
    evaluated = not desc.caps.no_indirect or upper in _runtime_reads(g, upper)
    shape = Shape(_d(sizes, lower), sizes.activations.get(lower), _d(sizes, upper), sizes.element_bytes,
                  graph=sizes.graphs.get(lower), hvp=sizes.hvps.get(lower),
                  upper=sizes.backwards.get(upper, 0) if evaluated else 0, batch=sizes.batches.get(upper, 0),
                  state=_state_floats(g, lower),
                  nested=nested, differentiable=differentiable, compiled=sizes.is_compiled)
    return desc.cost(args, shape)


def _nested(g: ProgramGraph, middle: str, planned: dict, sizes: Sizes) -> int:
    """The bytes of the differentiable pass below `middle` (under `exact`, each of its
    Hessian-vector products differentiates through the problems below it): its lower
    edges' methods, priced with every graph kept (`Shape.differentiable`)."""
    total = 0
    for (upper, lower), e in planned.items():
        if upper == middle:
            total += _cost(g, e.method, dict(e.args), sizes, lower, upper, differentiable=True)[1] or 0
    return total


def _with_state(g: ProgramGraph, e: EdgePlan, sizes: Sizes) -> EdgePlan:
    """`e` with the lower optimizer's state memory: its state floats · d · bytes per element."""
    d = _d(sizes, e.lower)
    return replace(e, state_memory=None if d is None else _state_floats(g, e.lower) * d * sizes.element_bytes)


def _fits(memory: int | None, budget: int | None) -> bool:
    return budget is None or memory is None or memory <= budget


def _plan_edge(g: ProgramGraph, e: HierarchyEdge, sizes: Sizes, budget, semantics, nested: int = 0) -> EdgePlan:
    args = dict(e.method.args)
    lower = g.problem(e.lower)
    caps = METHODS[e.method.name].caps
    if caps.planned:
        return _auto(g, e, sizes, budget, semantics, nested)
    if caps.unrolls and args.get("mode") == "auto":
        return _itd_mode(g, e, args, sizes, budget, "`mode = auto`", nested)
    time, memory = _cost(g, e.method.name, args, sizes, e.lower, e.upper, nested)
    reason = f"as written; lower optimizer {lower.optimizer.name}"
    if not _fits(memory, budget):
        reason += f"; over the memory budget ({format_bytes(memory)} > {format_bytes(budget)})"
    return EdgePlan(e.upper, e.lower, e.method.name, tuple(args.items()), e.unroll, time, memory, reason)


def _itd_mode(g: ProgramGraph, e: HierarchyEdge, args: dict, sizes: Sizes, budget, why: str,
              nested: int = 0) -> EdgePlan:
    """Reverse, forward or recompute: the fastest mode that fits the budget (ties: less memory)."""
    options = []
    for mode in ("reverse", "forward", "recompute"):
        a = {**args, "mode": mode}
        time, memory = _cost(g, ITD.name, a, sizes, e.lower, e.upper, nested)
        options.append((not _fits(memory, budget), time, memory or 0, mode, a))
    options.sort(key=lambda o: o[:3])
    if options[0][0]:                  # nothing fits: the smallest, however slow
        options.sort(key=lambda o: (o[2], o[1]))
    over, time, memory, mode, a = options[0]
    fitting = sum(not o[0] for o in options)
    reason = _itd_reason(mode, _d(sizes, e.upper), a.get("steps") or e.unroll, a.get("truncate"), why,
                         "the only mode that fits the budget" if fitting == 1 else "faster than recompute")
    if over:
        reason = f"{why}: nothing fits the budget; {mode} needs the least memory ({format_bytes(memory)} > {format_bytes(budget)})"
    return EdgePlan(e.upper, e.lower, ITD.name, tuple(a.items()), e.unroll, time, memory or None, reason)


def _itd_reason(mode: str, m: int | None, k: int, truncate: int | None, why: str, forward_why: str) -> str:
    """Why `mode`: what it keeps instead of reverse mode's graphs (`mloc.shared.unroll`)."""
    t = truncate or k
    marks, c = checkpoints(t), segment_length(t)
    return {"forward": f"{why}: {m} upper parameter(s), {k} steps: forward mode carries d×m numbers "
                       f"instead of {t} graphs (reverse) or {marks + c - 1} iterates (recompute), {forward_why}",
            "reverse": f"{why}: reverse mode is fastest and fits the budget",
            "recompute": f"{why}: reverse mode's {t} graphs exceed the budget; recompute keeps {marks} "
                         f"checkpoints and one {c}-step segment's iterates (about 2√T) and recomputes "
                         f"the others"}[mode]


def _auto(g: ProgramGraph, e: HierarchyEdge, sizes: Sizes, budget, semantics, nested: int = 0) -> EdgePlan:
    """`auto`'s choice among the methods whose descriptors declare an `AutoRank` and that
    apply (the lower optimizer provides what they need; `exact` semantics: differentiable;
    `strategy = fsdp`: `shards`):
    of those that fit the budget, the lowest tier, then the fastest; else the smallest."""
    lower = g.problem(e.lower)
    init_only = lower.init is not None and lower.init[0] == e.upper and \
        e.upper not in lower.loss.read_names()
    if init_only:
        return _itd_mode(g, e, {"steps": e.unroll, "truncate": None, "mode": "auto"}, sizes, budget,
                         "auto: the lower starts from the upper's weights (init), only itd sees that", nested)
    provides = OPTIMIZERS[lower.optimizer.name].caps.provides
    options = []
    for name, d in METHODS.items():
        caps = d.caps
        applies = caps.needs <= provides and (semantics != "exact" or caps.differentiable) \
            and (g.info.train.strategy != "fsdp" or caps.shards)    # sharded modules: first order only
        if caps.auto is None or not applies:
            continue
        args = {p.name: p.default for p in d.signature.params}     # `auto` gives the defaults
        time, memory = _cost(g, name, args, sizes, e.lower, e.upper, nested)
        options.append((not _fits(memory, budget), caps.auto.tier, time, memory or 0, name, args, memory))
    fits = sorted(o for o in options if not o[0])
    if fits:
        _, _, time, _, name, args, memory = fits[0]
        why = f"auto: {METHODS[name].caps.auto.reason}"
    else:                                   # nothing fits: the least memory
        _, _, time, _, name, args, memory = min(options, key=lambda o: (o[3], o[1]))
        why = f"auto: nothing fits the budget ({format_bytes(budget)}); the smallest method"
    return EdgePlan(e.upper, e.lower, name, tuple(args.items()), e.unroll, time, memory, why)
