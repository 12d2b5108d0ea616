"""The frozen payloads that the program graph's nodes and edges carry.

What the program *says*: every value keeps the span it came from, so any later stage can
point back at the source. Compiler decisions (plans, schedules) live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mloc.frontend import ast
from mloc.source import Span


@dataclass(frozen=True)
class PyCall:
    """A call into the user's Python module, e.g. `lib.weighted_ce(classifier, net, batch)`.

    `module` is the imported module's dotted path and `attr` the attribute called on it;
    `reads` lists the problems the call names, in order, with the span of each mention.
    """

    call: ast.Call
    module: str
    attr: str
    reads: tuple[tuple[str, Span], ...]

    @property
    def span(self) -> Span:
        return self.call.span

    @property
    def text(self) -> str:
        return self.call.span.text

    def read_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self.reads))


@dataclass(frozen=True)
class Builtin:
    """A checked call of a built-in (optimizer, method, schedule): every parameter bound,
    defaults filled in, in signature order."""

    name: str
    args: tuple[tuple[str, object], ...]
    span: Span

    def get(self, key: str):
        return dict(self.args)[key]

    def render(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args if v is not None)
        return f"{self.name}({inner})"


@dataclass(frozen=True)
class ProblemNode:
    name: str
    module: PyCall
    data: PyCall
    loss: PyCall
    optimizer: Builtin
    span: Span
    name_span: Span
    trainable: tuple[str, ...] = ("*",)
    frozen: tuple[str, ...] = ()
    meta_trainable: tuple[str, ...] | None = None
    init: tuple[str, Span] | None = None
    clip_grad_norm: float | None = None
    precision: str | None = None
    schedule: Builtin | None = None
    project: PyCall | None = None
    reinit: PyCall | bool = False
    accumulate: int = 1
    vmap: Span | None = None    # where `vmap = true` is written (None: false): the meta-batch vectorized
    order: int = 0              # position in the source, for stable tie-breaking


@dataclass(frozen=True)
class HierarchyEdge:
    """`upper -> lower`: the lower problem's best response is a function of the upper one."""

    upper: str
    lower: str
    method: Builtin
    unroll: int
    span: Span
    warmup: int = 0

    kind = "hierarchy"


@dataclass(frozen=True)
class DataflowEdge:
    """`src`'s parameters reach `dst`'s loss (or initialisation).

    kind: "u2l" (src is above dst), "l2u" (src is below dst), or "chain" (src is an earlier
    stage of the same interlocking chain). via: "loss" or "init".
    """

    src: str
    dst: str
    kind: str
    via: str
    span: Span


@dataclass(frozen=True)
class ChainSpec:
    stages: tuple[str, ...]
    interlock: int
    span: Span
    monitor: bool = False       # keep the heads no stage learns from, for reporting


@dataclass(frozen=True)
class EvalSpec:
    """`eval [name] every N = CALL`. `name` is the written one, or (unnamed) the called
    function's name; `named` says it was written, and then a dict's keys become `name.key`."""

    every: int
    call: PyCall
    name: str = ""
    named: bool = False


@dataclass(frozen=True)
class WatchSpec:
    """`checkpoint best on MODE METRIC`: keep `best.pt`, the state where `metric` was best."""

    metric: str
    mode: str                 # "max" or "min"
    span: Span


@dataclass(frozen=True)
class StopSpec:
    """`stop when MODE METRIC has not improved [by min_delta] for patience evals`."""

    metric: str
    mode: str
    patience: int
    min_delta: float
    span: Span


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 1000
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    memory_budget: int | None = None
    strategy: str = "auto"      # mloc.shared.strategy
    checkpoint_form: str = "gathered"   # mloc.shared.strategy.CHECKPOINT_FORMS
    evals: tuple[EvalSpec, ...] = ()
    checkpoint_every: int | None = None
    log_every: int = 10
    best: WatchSpec | None = None
    stop: StopSpec | None = None
    span: Span | None = None


@dataclass(frozen=True)
class ImportSpec:
    module: str
    bound: str
    path: str | None
    span: Span


@dataclass(frozen=True)
class ProgramInfo:
    """Program-level facts that belong to no single node or edge."""

    name: str
    source_path: str
    imports: tuple[ImportSpec, ...]
    semantics: str
    train: TrainSpec
    chains: tuple[ChainSpec, ...]


@dataclass(frozen=True)
class Link:
    """A declared hierarchy edge between two existing problems, valid or not in its options;
    structure checks (cycles, orphans) use these so one bad option does not hide them."""

    upper: str
    lower: str
    span: Span


@dataclass(frozen=True)
class Read:
    """Problem `dst` reads problem `src`, through its loss or its `init` field."""

    src: str
    dst: str
    via: str
    span: Span


@dataclass(frozen=True)
class ResolvedProgram:
    """The resolve pass's output: checked payloads, plus the declared structure.

    Structure checks use the declared structure (names, links, reads, chain groups) rather
    than the payloads, so an error in one field hides no independent error elsewhere;
    `uncertain` problems touch a declaration too broken to check anything about them.
    """

    info: ProgramInfo
    problems: tuple[ProblemNode, ...]
    edges: tuple[HierarchyEdge, ...]
    names: tuple[str, ...]                 # every uniquely declared problem, in source order
    name_spans: tuple[Span, ...]
    links: tuple[Link, ...]
    reads: tuple[Read, ...] = ()           # for every problem whose loss (and init) resolved
    readers: frozenset[str] = frozenset()  # the problems whose reads are known
    loss_spans: dict[str, Span] = field(default_factory=dict)   # for the readers
    chain_groups: tuple[tuple[str, ...], ...] = ()
    uncertain: frozenset[str] = frozenset()
    program_span: Span | None = None       # the `program NAME` line, for program-wide errors

    def reads_of(self, name: str) -> tuple[Read, ...]:
        return tuple(r for r in self.reads if r.dst == name)
