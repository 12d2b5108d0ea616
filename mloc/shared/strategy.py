"""The data-parallel strategies a run may name (`train { strategy = zero }`, `--strategy`),
and `auto`'s rule: one home for the checker's field type, both doors' flag, the planner's
line and the runtime's choice. Torch-free.

- ``ddp``: every rank holds the whole model, its gradients and its optimizer state, and
  averages the gradients (:mod:`mloc.runtime.base.overlap`);
- ``zero``: as ``ddp``, but each rank keeps and updates the optimizer state of its shard of
  the parameters only, and the updated parameters are broadcast from their owners (ZeRO
  stage 1, Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", SC 2020; :mod:`mloc.runtime.optim.zero`);
- ``fsdp``: parameters sharded too (FSDP2, :mod:`mloc.runtime.program.fsdp_run`); what it
  cannot run is :mod:`mloc.shared.sharding`'s to say; never chosen by `auto`;
- ``auto``: :func:`decide`.

`auto`'s rule (:func:`decide`), from the parameter bytes ``P`` and optimizer-state bytes
``S`` of the whole program and the world size ``N``: ``ddp`` with one process (nothing to
shard); ``ddp`` when ``S <= P`` (SGD: sharding saves less than one model copy a rank and
costs a broadcast of every parameter per step); ``ddp`` when the replicated total
``2P + S`` (parameters, gradients, state) is at most :data:`EASY` (it fits easily on any
device mloc targets); else ``zero``: the state dominates and each rank then keeps about
``S/N`` of it.
"""

from __future__ import annotations

STRATEGIES = ("auto", "ddp", "zero", "fsdp")

CHECKPOINT_FORMS = ("gathered", "sharded")
SHARDED = frozenset({"zero", "fsdp"})
"""The strategies whose state is split across the ranks: every rank takes part in gathering
it for a checkpoint (the run loop's `save`, the selection's `best.pt`)."""
"""How a `zero` run writes its checkpoints (`checkpoint_form`, `--checkpoint-form`): the whole
optimizer state gathered into rank 0's `checkpoint.pt` (the default, as `ddp` writes it), or
each rank's shard in a file of its own beside a manifest (:mod:`mloc.runtime.program.sharded`).
Every other strategy, and one process, writes gathered."""

UNAVAILABLE: dict[str, str] = {}
"""Strategies the vocabulary names but the runtime cannot run yet, and why."""

UNAVAILABLE_HELP = "use `zero` (sharded optimizer state) or `ddp`"

EASY = 2**30
"""Replicated bytes (parameters, gradients, optimizer state) that fit easily: 1 GiB."""


def unavailable(strategy: str | None) -> str | None:
    """Why ``strategy`` cannot run here (a sentence), or None when it can."""
    return UNAVAILABLE.get(strategy or "")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def decide(asked: str, world: int, params: int | None, state: int | None) -> tuple[str, str]:
    """``(strategy, reason)``: ``asked`` itself with "as written", or `auto`'s choice (see
    the module docstring) for ``world`` processes and ``params``/``state`` bytes (None:
    unknown, then ``ddp``)."""
    if asked != "auto":
        return asked, "as asked"
    if world <= 1:
        return "ddp", "auto: one process, nothing to shard"
    if params is None or state is None:
        return "ddp", "auto: the model's size is unknown"
    if state <= params:
        return "ddp", (f"auto: optimizer state {_size(state)} is no larger than the parameters {_size(params)}, "
                       "sharding it saves less than a model copy per rank")
    total = 2 * params + state
    if total <= EASY:
        return "ddp", (f"auto: parameters, gradients and optimizer state ({_size(total)}) fit easily "
                       f"(<= {_size(EASY)}) on every rank")
    return "zero", (f"auto: optimizer state {_size(state)} dominates and {_size(total)} replicated is over "
                    f"{_size(EASY)}; each of {world} ranks keeps about 1/{world} of the state")
