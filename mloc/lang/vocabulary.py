"""The fields of each block and the language's fixed choices.

Each `FieldSpec` says what one `key = value` of a block accepts; a "builtin" field names the
registry of `mloc.builtins` (optimizers, methods, schedules) its value is bound against.
The checker validates programs against these tables without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from mloc.lang.types import Bool, Device, Enum, Float, Int, ListOf, Size, Str, Type
from mloc.shared.composition import SEMANTICS
from mloc.shared.limits import MAX_REPEATS, MAX_SEED, WHY_REPEATS, WHY_SEED
from mloc.shared.precision import PRECISIONS
from mloc.shared.strategy import CHECKPOINT_FORMS, STRATEGIES

ITD_MODES = ("reverse", "forward", "recompute", "auto")


@dataclass(frozen=True)
class FieldSpec:
    """One `key = value` a block accepts.

    kind: "pycall" (a call into the user's Python module), "builtin" (a name or call from
    the `mloc.builtins` registry named by `table`), "problem" (a problem's name), "value"
    (a literal of `type`) or "flag_or_pycall" (`true`/`false`, or a pycall).
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
REPEATS = Int(1, limit=MAX_REPEATS, why=WHY_REPEATS)
"""A count repeated in every outer step (`unroll`, `accumulate`, a method's `iters`)."""
SEED = Int(0, limit=MAX_SEED, why=WHY_SEED)

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
    FieldSpec("reinit", "flag_or_pycall", "start again at each step of its upper: `true` from its "
              "own initial parameters, or a call that re-initializes its module", problems=True),
    FieldSpec("accumulate", "value", "micro-steps per optimizer step, their gradients averaged; "
              "on an upper problem each follows its own lower solve (a meta-batch)", type=REPEATS),
    FieldSpec("vmap", "value", "solve the lower problems of this problem's meta-batch "
              "(`accumulate = k`) at once, vectorized with torch.func.vmap (default: false, "
              "one after another)", type=Bool()),
    FieldSpec("project", "pycall", "runs on the problem's module, under no_grad, after every "
              "optimizer step (e.g. clamp a hyperparameter)", problems=True),
)}

EDGE_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("hypergrad", "builtin", "the best-response-Jacobian method (default: auto)",
              table="methods"),
    FieldSpec("unroll", "value", "lower-problem steps per upper step (default: 1)", type=REPEATS),
    FieldSpec("warmup", "value", "steps the lower problem takes alone before the upper's first "
              "step (default: 0)", type=Int(0)),
)}

CHAIN_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("interlock", "value", "n-wise interlocking: each stage learns from the loss "
              "n-1 stages ahead (1 = local, number of stages = end-to-end)", required=True,
              type=Int()),
    FieldSpec("monitor", "value", "keep the heads no stage learns from (pruned otherwise), "
              "trained on their own loss and logged (default: false)", type=Bool()),
)}

TRAIN_FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("steps", "value", "outer training steps", required=True, type=Int(1)),
    FieldSpec("seed", "value", "random seed", type=SEED),
    FieldSpec("device", "value", "where to train", type=Device()),
    FieldSpec("precision", "value", "default autocast precision", type=Enum(PRECISIONS)),
    FieldSpec("memory_budget", "value", "memory the planner may use", type=Size()),
    FieldSpec("strategy", "value", "data parallelism: `ddp` (replicated), `zero` (optimizer state "
              "sharded), `fsdp`, or `auto` (the default: the planner's choice)", type=Enum(STRATEGIES)),
    FieldSpec("checkpoint_form", "value", "under `strategy = zero`: `gathered` (the default: one "
              "checkpoint.pt, as ddp writes it) or `sharded` (each rank writes its optimizer-state "
              "shard, checkpoint.pt holds the rest and the manifest)", type=Enum(CHECKPOINT_FORMS)),
)}

TRAIN_EVERY = {"eval": "run an evaluation call", "checkpoint": "write a checkpoint",
               "log": "log metrics"}


def interval_field(kind: str) -> str:
    """The field a periodic action without a call is known by: `log every 50` is the train
    spec's `log_every` (as `mloc graph` prints it, and `--set train.log_every=50` sets it)."""
    return f"{kind}_every"


TRAIN_INTERVALS: dict[str, str] = {interval_field(k): k for k in TRAIN_EVERY if k != "eval"}
"""`log_every` -> `log`, `checkpoint_every` -> `checkpoint` (an `eval` is named and calls)."""

SETTINGS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("semantics", "value", "hypergradients above two levels: `exact` (nested total "
              "derivative) or `per_edge` (Betty's)", type=Enum(SEMANTICS)),
)}

RESERVED = frozenset({"batch"})
