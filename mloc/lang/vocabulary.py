"""Built-in optimizers, hypergradient methods and schedules, and the fields of each block.

Each built-in is a `Signature`: ordered parameters with types, ranges and defaults. The
runtime implements the same names (`mloc.runtime`); the checker validates calls against
these tables without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from mloc.lang.types import (Bool, Device, Enum, Float, Int, ListOf, Size, Str, TupleOf, Type)


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
    """A built-in callable. `tags` carry facts the checker needs (e.g. "differentiable")."""

    name: str
    params: tuple[Param, ...]
    doc: str
    tags: frozenset[str] = frozenset()

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def _sig(name: str, doc: str, *params: Param, tags: tuple[str, ...] = ()) -> Signature:
    return Signature(name, params, doc, frozenset(tags))


LR = Float(0, open_lo=True)
UNIT = Float(0, 1, open_hi=True)
BETAS = TupleOf((UNIT, UNIT))
WD = Float(0)

OPTIMIZERS: dict[str, Signature] = {s.name: s for s in (
    _sig("sgd", "stochastic gradient descent with optional (Nesterov) momentum",
         Param("lr", LR, doc="learning rate"), Param("momentum", UNIT, 0.0),
         Param("nesterov", Bool(), False), Param("weight_decay", WD, 0.0),
         Param("dampening", Float(0, 1), 0.0), tags=("differentiable", "sama")),
    _sig("adam", "Adam (Kingma & Ba, 2015), L2 weight decay added to the gradient",
         Param("lr", LR, 1e-3), Param("betas", BETAS, (0.9, 0.999)),
         Param("eps", Float(0, open_lo=True), 1e-8), Param("weight_decay", WD, 0.0),
         tags=("differentiable", "sama")),
    _sig("adamw", "AdamW (Loshchilov & Hutter, 2019), decoupled weight decay",
         Param("lr", LR, 1e-3), Param("betas", BETAS, (0.9, 0.999)),
         Param("eps", Float(0, open_lo=True), 1e-8), Param("weight_decay", WD, 1e-2),
         tags=("differentiable", "sama")),
    _sig("shampoo", "Shampoo (Gupta et al. 2018; Anil et al. 2020): Kronecker-factored "
         "preconditioning with coupled-Newton inverse roots, grafting and blocking",
         Param("lr", LR, 1e-3), Param("beta2", Float(0, 1, open_lo=True), 1.0),
         Param("momentum", UNIT, 0.9), Param("nesterov", Bool(), True),
         Param("epsilon", Float(0, open_lo=True), 1e-6),
         Param("weight_decay", WD, 0.0), Param("decoupled_weight_decay", Bool(), True),
         Param("update_every", Int(1), 1), Param("start_preconditioning_step", Int(0), 5),
         Param("block_size", Int(1), 128),
         Param("graft", Enum(("sgd", "adagrad", "rmsprop", "adam")), "adagrad"),
         Param("staleness", Int(0), 0)),
)}

ITD_MODES = ("reverse", "forward", "recompute", "auto")

METHODS: dict[str, Signature] = {s.name: s for s in (
    _sig("itd", "iterative differentiation: backpropagate through the unrolled lower steps",
         Param("steps", Int(1), None, doc="steps differentiated (default: the edge's unroll)"),
         Param("truncate", Int(1), None, doc="differentiate only the last T steps"),
         Param("mode", Enum(ITD_MODES), "auto"), tags=("unrolled",)),
    _sig("cg", "implicit differentiation, H⁻¹v by conjugate gradients",
         Param("iters", Int(1), 10), Param("tol", Float(0), 1e-10), tags=("implicit",)),
    _sig("neumann", "implicit differentiation, H⁻¹v by a truncated Neumann series",
         Param("iters", Int(1), 5), Param("alpha", Float(0, open_lo=True), 0.1),
         tags=("implicit",)),
    _sig("finite_diff", "identity Hessian, mixed product by central differences (DARTS)",
         Param("eps", Float(0, open_lo=True), 0.01)),
    _sig("sama", "SAMA: finite differences on the optimizer-adjusted direction",
         Param("eps", Float(0, open_lo=True), 0.01), tags=("sama",)),
    _sig("first_order", "drop the indirect term (first-order MAML)"),
    _sig("auto", "let the planner choose a method under the memory budget"),
)}

SCHEDULES: dict[str, Signature] = {s.name: s for s in (
    _sig("constant", "the optimizer's learning rate, unchanged"),
    _sig("cosine", "cosine decay to min_lr over `total` steps, after a linear warm-up",
         Param("total", Int(1)), Param("warmup", Int(0), 0), Param("min_lr", Float(0), 0.0)),
    _sig("linear", "linear decay to zero over `total` steps, after a linear warm-up",
         Param("total", Int(1)), Param("warmup", Int(0), 0)),
    _sig("step", "multiply by gamma every `every` steps",
         Param("every", Int(1)), Param("gamma", Float(0, 1, open_lo=True), 0.1)),
    _sig("exponential", "multiply by gamma every step",
         Param("gamma", Float(0, 1, open_lo=True))),
)}

PRECISIONS = ("fp32", "bf16", "fp16")
SEMANTICS = ("exact", "per_edge")


@dataclass(frozen=True)
class FieldSpec:
    """One `key = value` a block accepts.

    kind: "pycall" (a call into the user's Python module), "builtin" (a name or call from
    `table`), "problem" (a problem's name) or "value" (a literal of `type`).
    """

    name: str
    kind: str
    doc: str
    required: bool = False
    type: Type | None = None
    table: str | None = None
    problems: bool = False      # may name problems (losses and evaluations)
    batch: bool = False         # may use the reserved name `batch`


PATTERNS = ListOf(Str(), min_len=1)

PROBLEM_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("module", "pycall", "constructs the problem's torch.nn.Module", required=True),
    FieldSpec("data", "pycall", "yields the problem's batches", required=True),
    FieldSpec("loss", "pycall", "the problem's scalar loss; names the problems it reads",
              required=True, problems=True, batch=True),
    FieldSpec("optimizer", "builtin", "the optimizer that steps the parameters", required=True,
              table="optimizers"),
    FieldSpec("trainable", "value", "glob patterns of the parameters this problem trains "
              "(default: all)", type=PATTERNS),
    FieldSpec("frozen", "value", "glob patterns of parameters never trained", type=PATTERNS),
    FieldSpec("meta_trainable", "value", "glob patterns of the parameters that receive "
              "hypergradients from the problems below (default: all trainable)", type=PATTERNS),
    FieldSpec("init", "problem", "start each unroll from this (upper) problem's parameters, "
              "as MAML does"),
    FieldSpec("clip_grad_norm", "value", "clip the gradient's global norm",
              type=Float(0, open_lo=True)),
    FieldSpec("precision", "value", "this problem's autocast precision", type=Enum(PRECISIONS)),
    FieldSpec("schedule", "builtin", "learning-rate schedule", table="schedules"),
)}

EDGE_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("hypergrad", "builtin", "the best-response-Jacobian method (default: auto)",
              table="methods"),
    FieldSpec("unroll", "value", "lower-problem steps per upper step (default: 1)", type=Int(1)),
)}

CHAIN_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("interlock", "value", "n-wise interlocking: each stage learns from the loss "
              "n-1 stages ahead (1 = local, number of stages = end-to-end)", required=True,
              type=Int()),
)}

TRAIN_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("steps", "value", "outer training steps", required=True, type=Int(1)),
    FieldSpec("seed", "value", "random seed", type=Int(0)),
    FieldSpec("device", "value", "where to train", type=Device()),
    FieldSpec("precision", "value", "default autocast precision", type=Enum(PRECISIONS)),
    FieldSpec("memory_budget", "value", "memory the planner may use", type=Size()),
)}

TRAIN_EVERY = {"eval": "run an evaluation call", "checkpoint": "write a checkpoint",
               "log": "log metrics"}

SETTINGS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("semantics", "value", "hypergradients above two levels: `exact` (nested total "
              "derivative) or `per_edge` (Betty's)", type=Enum(SEMANTICS)),
)}

TABLES = {"optimizers": OPTIMIZERS, "methods": METHODS, "schedules": SCHEDULES}

RESERVED = frozenset({"batch"})
