"""When Shampoo's inverse roots are computed and from which step they are used: a fact the
runtime (:class:`mloc.runtime.optim.rootwork.RootWork`) and the checker (W106,
``mloc/passes/builtins.py``) both read, so it lives here, torch-free, once."""

from __future__ import annotations


def shampoo_roots_due(step: int, update_every: int, staleness: int) -> int | None:
    """Shampoo's root schedule, the one rule the runtime (``RootWork.refresh``) and the
    checker (W106) both read: roots are computed from the statistics of every step that is a
    multiple of ``update_every`` and used from ``staleness`` steps later (by that step's own
    update for staleness 0); None for a step that computes none. The first roots are thus
    used from step ``update_every + staleness``; before, the roots are identities."""
    return step + staleness if step % update_every == 0 else None
