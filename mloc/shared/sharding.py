"""What `strategy = fsdp` runs, and why the rest is refused: one home for the rules that
`mloc check`/`mloc plan` (E221, :mod:`mloc.passes.dataflow`) and the runtime (`--strategy
fsdp` on a program compiled without it: exit 2, :mod:`mloc.runtime.program.fsdp_run`) apply
to the facts each of them knows. Torch-free.

Under fsdp every module is sharded by FSDP2 (:mod:`mloc.runtime.base.fsdp`): each rank holds
``1/N`` of every parameter, and the only gradients are those a ``backward()`` reduce-scatters
into ``.grad``. The run path (:mod:`mloc.runtime.program.fsdp_run`) therefore takes plain steps
and the first-order hypergradients (the methods whose registry caps say ``shards``; E220
refuses the others) of **two-level** programs (each upper over exactly one lower that has
none of its own), commits with mloc's functional optimizers on the local shards, and
gathers whole tensors for checkpoints. A setting in :func:`refusals` needs something a
shard does not hold (the whole gradient, the whole matrix, the whole module) or a path
that has not been wired for shards; each comes with what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass

ALTERNATIVE = "or `strategy = zero` (sharded optimizer state, whole modules)"


@dataclass(frozen=True)
class ProblemFacts:
    """What the rules read of one problem. ``optimizer``: its registry name (``sgd``,
    ``adam``, ``adamw``, ``shampoo``, ``torch``)."""

    name: str
    optimizer: str
    lowers: tuple[str, ...] = ()
    uppers: tuple[str, ...] = ()
    precision: str | None = None
    clip: bool = False
    init: bool = False
    reinit: bool = False
    project: bool = False
    accumulate: bool = False


def refusals(problems: tuple[ProblemFacts, ...], chains: bool = False, compile: str | None = None
             ) -> list[tuple[str, str]]:
    """``(why, help)`` for each thing of the program that `strategy = fsdp` cannot run
    (empty: it runs). ``compile``: the `--compile`/`compile` setting (``on`` is refused,
    ``auto`` stays eager under fsdp)."""
    out = []
    if compile == "on":
        out.append(("`compile = on`: torch.compile does not trace mloc's steps through FSDP2's "
                    "all-gather and reduce-scatter hooks", "use `--compile off` (under fsdp `auto` stays eager)"))
    if chains:
        out.append(("interlocking stages (`interlock`) pass whole parameters between their steps",
                    f"run the stages without `interlock`, {ALTERNATIVE}"))
    for p in problems:
        out += [(f"`{p.name}`: {why}", f"{help}, {ALTERNATIVE}") for why, help in _problem(p)]
    return out


def _problem(p: ProblemFacts) -> list[tuple[str, str]]:
    out = []
    if len(p.lowers) > 1:
        out.append((f"it has {len(p.lowers)} lower problems; the sharded hypergradient is taken over one",
                    "give each upper problem one lower problem"))
    if p.lowers and p.uppers:
        out.append(("it is both an upper and a lower problem (three levels): a middle problem's "
                    "hypergradient needs second-order products through its lower, which shards do not give",
                    "use two levels"))
    if p.optimizer == "shampoo":
        out.append(("Shampoo's preconditioners are built from whole weight matrices, and a rank holds "
                    "only some rows of each", "use sgd, adam or adamw"))
    if p.optimizer == "torch":
        out.append(("a `torch.optim` optimizer steps whole parameters in place; mloc steps the "
                    "local shards with its functional optimizers", "use sgd, adam or adamw"))
    if p.precision == "fp16":
        out.append(("fp16 loss scaling unscales and checks the whole gradient, and a rank holds a shard of it",
                    "use `precision = bf16` or fp32"))
    if p.clip:
        out.append(("`clip_grad_norm` needs the norm of the whole gradient; the pipeline's clip reads "
                    "this rank's shard only", "drop `clip_grad_norm`"))
    if p.init:
        out.append(("`init` trains a δ over another problem's whole parameters", "drop `init`"))
    if p.reinit:
        out.append(("`reinit` starts again from whole parameters, not yet kept for shards", "drop `reinit`"))
    if p.project:
        out.append(("`project` runs on the whole module after each step; the module holds shards",
                    "drop `project`"))
    if p.accumulate:
        out.append(("gradient accumulation and meta-batches (`accumulate`, `vmap`) are not wired for shards",
                    "drop `accumulate`"))
    return out
