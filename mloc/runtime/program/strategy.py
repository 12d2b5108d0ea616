"""The run's data-parallel strategy, applied to its built problems (`strategy`, `--strategy`:
:mod:`mloc.shared.strategy` has the names and `auto`'s rule, which is applied here to the
sizes measured on the built problems: every parameter's bytes and every optimizer state's).

Under ``zero`` with more than one process each problem's optimizer is wrapped in
:class:`~mloc.runtime.optim.zero.Zero` and its state cut to the rank's shard; under
``fsdp`` the modules were sharded already (:mod:`mloc.runtime.program.fsdp_run`, before the
optimizers are built on the local shards); under ``ddp`` (and with one process, where
nothing is sharded) nothing changes.
"""

from __future__ import annotations

from typing import Any, Mapping

from mloc.runtime.base import tree
from mloc.runtime.files.options import OptionError
from mloc.runtime.optim.zero import Zero
from mloc.shared.strategy import SHARDED, UNAVAILABLE_HELP, decide, unavailable


def apply_strategy(live: Mapping[str, Any], asked: str, rank: int, world: int) -> tuple[str, str]:
    """``(strategy, reason)`` for the problems of ``live`` (each a built
    :class:`~mloc.runtime.program.build.Live` whose optimizer state is fresh), their
    optimizers wrapped when it is ``zero`` and ``world`` > 1; an :class:`OptionError`
    (exit 2) for a strategy that is not available."""
    if unavailable(asked):
        raise OptionError(f"strategy {asked}: {unavailable(asked)}", UNAVAILABLE_HELP)
    params = sum(p.numel() * p.element_size() for lv in live.values() for p in lv.problem.params)
    state = sum(t.numel() * t.element_size() for lv in live.values() for t in tree.tensors(lv.problem.state))
    chosen, why = decide(asked, world, params, state)
    if chosen in SHARDED and world <= 1:
        return "ddp", f"{why}; one process: nothing to shard"
    if chosen == "zero":
        for lv in live.values():
            lv.problem.optimizer = Zero(lv.problem.optimizer, rank, world)
            lv.problem.state = lv.problem.optimizer.init(lv.problem.params)
    return chosen, why
