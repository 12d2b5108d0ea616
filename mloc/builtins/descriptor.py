"""What a built-in (optimizer, hypergradient method, schedule) is, declared once.

A `Descriptor` joins the views every stage needs of one built-in:

- `signature`: ordered parameters with types, ranges and defaults (the checker's view);
- `caps`: frozen capabilities (`OptimizerCaps`, `MethodCaps`, `ScheduleCaps`) that the
  checks, the planner and codegen read instead of comparing names;
- `cost`: for a method, `cost(args, shape) -> (time in G, memory in bytes or None)`, a pure
  function of the sizes (the planner's view); None where the planner has nothing to price;
- `hyper`: for an optimizer, its hyperparameter record (`mloc.shared.hyper`): the
  signature is read from it, and it says which field a schedule scales (`rate`) and which
  a torch scheduler may drive; the implementation steps with the same record;
- `runtime`: `"module:attr"` of the runtime factory generated code calls, or None while
  the built-in is checked but not implemented (the checker reports E704 where it is used);
- `aliases`: the names the literature gives it (`darts` for `finite_diff`), each with the
  call that is that method and who named it: not accepted as names (one spelling per
  built-in), but an unknown name that is one gets the built-in as its did-you-mean.

Nothing here imports torch: `Descriptor.load()` imports the runtime factory lazily and
only code that executes a program calls it.
"""

from __future__ import annotations

import importlib
from dataclasses import MISSING, dataclass
from typing import Callable, Union

from mloc.lang.types import Kwargs, Ref, Type


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Param:
    name: str
    type: Type
    default: object = REQUIRED
    doc: str = ""


@dataclass(frozen=True)
class Signature:
    """A built-in callable as the language sees it: name, ordered parameters, one-line doc."""

    name: str
    params: tuple[Param, ...]
    doc: str

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def reference(self) -> Param | None:
        """The parameter that names a Python class or function (a `Ref`), if any: such a
        built-in may also be written as that name's call, `torch.optim.RAdam(lr=1e-3)`."""
        return next((p for p in self.params if isinstance(p.type, Ref)), None)

    @property
    def rest(self) -> Param | None:
        """The parameter collecting the keyword arguments no other one names (`Kwargs`)."""
        return next((p for p in self.params if isinstance(p.type, Kwargs)), None)


def signature(name: str, doc: str, *params: Param) -> Signature:
    return Signature(name, params, doc)


def record_signature(record: type, name: str, doc: str, types: dict[str, "Type | Param"]) -> Signature:
    """The signature of a hyperparameter record (`mloc.shared.hyper.Hyper`): its fields in
    order, with their defaults and docs; `types` gives each field's language type (or a
    whole `Param`, where the language's value differs from Python's: a `Ref`, `Kwargs`)."""
    spec = record.spec()
    missing = {n for n, _, _ in spec} ^ set(types)
    if missing:
        raise ValueError(f"the types of {name}'s record {record.__name__} do not match its fields: {sorted(missing)}")
    return Signature(name, tuple(types[n] if isinstance(types[n], Param) else
                                 Param(n, types[n], REQUIRED if default is MISSING else default, pdoc)
                                 for n, default, pdoc in spec), doc)


@dataclass(frozen=True)
class OptimizerCaps:
    """`differentiable`: its update is a differentiable function of the gradient and state,
    so `itd` can unroll it. `sama_diag`: it offers the diagonal ∂update/∂grad SAMA needs.
    `state_per_param`: floats of optimizer state per trained parameter (at most).
    `diag_reads_grad`: its diagonal (`sama_diag`) reads the current gradient (Adam's
    moments do; SGD's rate does not), so SAMA takes, and under data parallelism averages,
    the lower gradient first (the runtime's `Optimizer.diag_uses_grad`, checked equal).
    `task_vmap`: its update runs under `torch.func` transforms and `vmap` (pure tensor
    code, no data-dependent Python branch), so a vectorized meta-batch can step with it."""

    differentiable: bool = False
    sama_diag: bool = False
    task_vmap: bool = False
    state_per_param: int = 0
    diag_reads_grad: bool = False
    opaque: str = ""
    """Why a method cannot look inside its update, where it says more than the missing
    capability (the checker's E401 adds it as a note)."""

    @property
    def provides(self) -> frozenset[str]:
        """The names of the boolean capabilities it has (what `MethodCaps.needs` asks for)."""
        return frozenset(n for n in ("differentiable", "sama_diag") if getattr(self, n))


@dataclass(frozen=True)
class AutoRank:
    """That `auto` may choose a method, and how it ranks: among the methods that fit the
    memory budget (their `cost` with the signature's defaults, the arguments `auto` gives
    them), those of the lowest `tier` (accuracy first: 0 the most accurate), and among
    those the fastest; when none fits, the one needing the least memory. `reason`: what
    the plan prints when it is chosen (after "auto: ")."""

    tier: int
    reason: str


@dataclass(frozen=True)
class SyncCaps:
    """What a method's BR-VJP averages across data-parallel replicas in one upper step,
    besides what every upper step averages (the upper's gradient that seeds it, unless the
    method has no indirect term, and the final hypergradient): each average is one
    synchronised backward (`mloc.runtime.base.overlap`). `hvps`: the argument that counts
    its Hessian-vector products, each averaged (cg's and neumann's `iters`). `lower_grad`:
    the lower gradient its direction reads, when the lower optimizer's diagonal reads it
    (`OptimizerCaps.diag_reads_grad`: SAMA over Adam). A method that unrolls differentiates
    per replica: nothing of its own is averaged."""

    hvps: str | None = None
    lower_grad: bool = False

    def count(self, args: dict, diag_reads_grad: bool) -> tuple[int, tuple[str, ...]]:
        """The synchronised backwards of one BR-VJP with arguments `args`, and what each averages."""
        parts: list[str] = []
        if self.hvps is not None:
            k = int(args[self.hvps])
            parts.append(f"{k} Hessian-vector product{'s' * (k != 1)}")
        if self.lower_grad and diag_reads_grad:
            parts.append("the lower gradient its diagonal reads")
        n = (int(args[self.hvps]) if self.hvps is not None else 0) + (self.lower_grad and diag_reads_grad)
        return n, tuple(parts)


@dataclass(frozen=True)
class MethodCaps:
    """`unrolls`: differentiates through the edge's unrolled lower steps (its `steps`
    default to the edge's `unroll`). `implicit`: solves with the lower Hessian.
    `reads_init`: carries a hypergradient to an upper that enters only through `init`.
    `differentiable`: its BR-VJP can itself be differentiated (`exact` semantics below a
    middle level). `needs`: optimizer capabilities (`OptimizerCaps.provides`) it requires of
    the lower problem's optimizer. `planned`: a placeholder the planner replaces with a
    concrete method (`auto`); it never reaches the runtime.

    What the hypergradient composer (`mloc.ir.composition.step_caps`) reads: `no_indirect`:
    the method drops the indirect term, so the composer skips the edge (`first_order`).
    `fusable`: with `mode="reverse"`, two levels, the upper's loss can back-propagate through
    the unrolled point directly (one backward). `two_level`: the runtime offers the whole
    two-level step as one closure, with the same numbers as the general path.
    `task_vmap`: a meta-batch of its lower solves can be vectorized (`vmap = true`): the
    runtime object offers `solve(op, v) -> q ≈ H⁻¹v` on Hessian-vector products, or the
    method has no indirect term (`no_indirect`); declared here, checked at `mloc check`
    (E219 for `vmap` with a method without it) and by the registry tests (`solve` exists).
    `auto`: that the planner's `auto` may choose it, and how it ranks (`AutoRank`).
    `sync`: what it averages across data-parallel replicas (`SyncCaps`). `shards`: its
    hypergradient takes only first-order gradients by `backward()` through forward passes of
    the modules, so it runs on modules sharded by FSDP2 (`strategy = fsdp`,
    `mloc.runtime.base.fsdp`); `unsharded_reason` says why another method cannot."""

    unrolls: bool = False
    implicit: bool = False
    reads_init: bool = False
    differentiable: bool = False
    needs: frozenset[str] = frozenset()
    planned: bool = False
    no_indirect: bool = False
    fusable: bool = False
    two_level: bool = False
    task_vmap: bool = False
    auto: AutoRank | None = None
    sync: SyncCaps = SyncCaps()
    shards: bool = False

    @property
    def reads_lower_state(self) -> bool:
        """Whether its hypergradient reads the lower optimizer's state (an unroll steps the
        optimizer; a capability in `needs`, SAMA's diagonal, reads its moments and step
        count): a compiled upper step then depends on the state's numbers."""
        return self.unrolls or bool(self.needs)

    @property
    def unsharded_reason(self) -> str | None:
        """Why the method cannot run on FSDP2-sharded modules (None when it `shards`): what
        `mloc plan`/`mloc check` and the runtime say under `strategy = fsdp`."""
        if self.shards:
            return None
        if self.unrolls:
            why = "it differentiates through the lower's unrolled optimizer steps"
        elif self.implicit:
            why = "it solves with Hessian-vector products of the lower's whole loss"
        else:
            why = "it needs second-order products of the lower's loss"
        return (f"{why}, and a parameter sharded by FSDP2 gets its gradient only through backward() "
                "into .grad, which cannot be differentiated again")


@dataclass(frozen=True)
class ScheduleCaps:
    """`identity`: the base learning rate unchanged (no schedule is emitted). `takes_base`:
    the factory also takes `base=`, the optimizer's learning rate (its floor is absolute)."""

    identity: bool = False
    takes_base: bool = False


Caps = Union[OptimizerCaps, MethodCaps, ScheduleCaps]


@dataclass(frozen=True)
class Shape:
    """The sizes a cost depends on, measured by the compiler's dataflow pass on the meta
    device (`mloc.runtime.grad.introspect.probe_loss`): `d` trainable parameters of the
    lower problem, `act` bytes one forward of its loss keeps for the backward, `m`
    parameters of the upper problem, `b` bytes per element. None where not measured.

    For the memory of a whole hypergradient step: `graph`, the bytes the graph of the
    lower's own gradient keeps (``create_graph=True``: one unrolled step's graph);
    `hvp`, the peak bytes of one Hessian-vector product through it (the graph included);
    `upper`, the peak bytes of the upper loss's forward and backward (the adjoint `v`),
    0 when the step does not evaluate it; `batch`, the bytes of the upper's batch, drawn in
    the step; `state`, the lower optimizer's state in floats per parameter; `nested`, the
    bytes of the differentiable passes below the lower (a middle problem under `exact`
    semantics: every Hessian-vector product of its reduced objective runs one);
    `differentiable`: the cost of that differentiable pass itself (``create_graph=True``:
    every graph it builds is kept for the pass above)."""

    d: int | None = None
    act: int | None = None
    m: int | None = None
    b: int = 4
    graph: int | None = None
    hvp: int | None = None
    upper: int | None = None
    batch: int = 0
    state: int = 0
    nested: int = 0
    differentiable: bool = False
    compiled: bool = False      # the step compiled: the sizes are a compiled step's (`mloc.passes.plan.Sizes.compiled`)

    @property
    def known(self) -> bool:
        return self.d is not None and self.act is not None


Cost = Callable[[dict, Shape], "tuple[float, int | None]"]


@dataclass(frozen=True)
class Alias:
    """A name the literature uses for a built-in: `name` (as a user may write it, in lower
    case), `call` (the built-in's call that is that method), `source` (what it is there and
    the paper, read after "It is": "DARTS's second-order approximation (Liu et al., 2019)")."""

    name: str
    call: str
    source: str


@dataclass(frozen=True)
class Descriptor:
    signature: Signature
    caps: Caps
    runtime: str | None
    cost: Cost | None = None
    aliases: tuple[Alias, ...] = ()
    hyper: type | None = None

    @property
    def rate(self) -> str | None:
        """The parameter a schedule scales (an optimizer's record's `RATE`), if any."""
        return getattr(self.hyper, "RATE", None)

    @property
    def name(self) -> str:
        return self.signature.name

    @property
    def executable(self) -> bool:
        """Whether a program using it can run: it has a runtime, or the planner replaces it."""
        return self.runtime is not None or getattr(self.caps, "planned", False)

    def load(self) -> Callable:
        """The runtime factory (imports the runtime, hence torch)."""
        if self.runtime is None:
            raise LookupError(f"`{self.name}` has no runtime implementation yet")
        module, attr = self.runtime.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def runtime_module(self) -> str | None:
        return self.runtime.split(":")[0] if self.runtime else None

    @property
    def runtime_attr(self) -> str | None:
        return self.runtime.split(":")[1] if self.runtime else None


def optimizer(record: type, name: str, doc: str, caps: OptimizerCaps, runtime: str | None,
              **types: "Type | Param") -> Descriptor:
    """An optimizer's descriptor, its signature read from its hyperparameter `record`
    (`record_signature`; `types`: each field's language type). The record must name its
    rate, a field, and drive only its own fields (or any: `"*"`)."""
    names = {n for n, _, _ in record.spec()}
    if record.RATE not in names or not set(record.SCHEDULABLE) <= names | {"*"}:
        raise ValueError(f"{record.__name__}: RATE must be one of its fields {sorted(names)}, and "
                         f"SCHEDULABLE some of them (got {record.RATE!r}, {record.SCHEDULABLE!r})")
    return Descriptor(record_signature(record, name, doc, types), caps, runtime, hyper=record)


def alias_in(table: dict[str, Descriptor], name: str) -> Alias | None:
    """The alias `name` (any case, `-` as `_`) of a built-in of `table`, if it is one."""
    key = name.lower().replace("-", "_")
    return next((a for d in table.values() for a in d.aliases if a.name == key), None)
