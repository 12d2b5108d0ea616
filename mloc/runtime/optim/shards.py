"""Optimizer states cut into shards of parameters and joined again, as the plain trees a
checkpoint holds (:func:`mloc.runtime.base.tree.to_plain`): what ZeRO's ranks keep
(:mod:`.zero`), and how a gathered checkpoint is written from them and read back into any
world size.

Every optimizer's state is a NamedTuple whose per-parameter fields are tuples aligned with
the parameters (``()`` where the optimizer keeps none, SGD without momentum); the others
(a step count) are the same on every rank. Which fields are per parameter is the
optimizer's declaration, ``PER_PARAM`` (by the class of its state); Shampoo's ``pending``
slots hold per-parameter ``roots`` and ``status`` inside each slot (``SLOTS``).

- :func:`owners`: parameter ``i`` to a rank, whole tensors, balanced by the bytes of their
  optimizer state (greedy, largest first, to the least loaded rank; ties to the lower
  rank and the earlier tensor), so every rank computes the same split from the shapes.
- :func:`select`: the plain state of the parameters ``index`` (in that order).
- :func:`join`: the plain state of all ``n`` parameters from the ranks' selections.
"""

from __future__ import annotations

from typing import Any, Sequence

PER_PARAM = {"SGDState": ("momentum",), "AdamState": ("mu", "nu"),
             "ShampooState": ("stats", "roots", "failures", "graft", "momentum"), "TorchState": ("per_param",)}
"""The per-parameter fields of each optimizer state (by the state's class name)."""

SLOTS = {"ShampooState": ("pending", ("roots", "status"))}
"""A field holding slots whose entries are per-parameter (Shampoo's pending roots)."""


class UnshardableState(ValueError):
    """An optimizer state whose per-parameter fields are not declared (:data:`PER_PARAM`)."""


def owners(weights: Sequence[int], world: int) -> tuple[int, ...]:
    """The rank that owns each parameter: greedy by ``weights`` (bytes), largest first, to
    the least loaded rank (LPT scheduling: within 4/3 of the best balance; Graham 1969)."""
    load, out = [0] * world, [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += weights[i]
    return tuple(out)


def fields_of(plain: dict) -> tuple[tuple[str, ...], tuple | None]:
    """The per-parameter fields of a plain state, and its slot field (or None)."""
    kind = plain.get("_type") if isinstance(plain, dict) else None
    if kind not in PER_PARAM:
        raise UnshardableState(f"strategy zero cannot shard a {kind or type(plain).__name__} (its per-parameter "
                               "fields are not declared in mloc.runtime.optim.shards.PER_PARAM)")
    return PER_PARAM[kind], SLOTS.get(kind)


def select(plain: dict, index: Sequence[int]) -> dict:
    """``plain`` (a whole state) restricted to the parameters ``index``."""
    fields, slots = fields_of(plain)
    out = dict(plain)
    for f in fields:
        out[f] = [plain[f][i] for i in index] if plain[f] else []
    if slots is not None:
        name, inner = slots
        out[name] = [{**s, **{k: [s[k][i] for i in index] if s[k] else [] for k in inner}} for s in plain[name]]
    return out


def join(parts: Sequence[tuple[Sequence[int], dict]], n: int) -> dict:
    """The whole state of ``n`` parameters from ``parts``, each the indices a rank owns and
    its plain state (:func:`select`'s form). The fields that are not per parameter are
    taken from the part with the most parameters (a rank that owns none never stepped)."""
    base = max(parts, key=lambda p: len(p[0]))[1]
    fields, slots = fields_of(base)
    out = dict(base)
    for f in fields:
        out[f] = _merged([(index, state[f]) for index, state in parts], n, f)
    if slots is not None:
        name, inner = slots
        out[name] = [{**slot, **{k: _merged([(index, state[name][j][k]) for index, state in parts], n, k)
                                 for k in inner}} for j, slot in enumerate(base[name])]
    return out


def _merged(pieces: Sequence[tuple[Sequence[int], list]], n: int, what: str) -> list:
    """Entries placed by index; ``[]`` when no part holds any (a field the optimizer leaves empty)."""
    entries: list[Any] = [None] * n
    held = False
    for index, values in pieces:
        if len(values) == len(index) and index:
            held = True
            for i, v in zip(index, values):
                entries[i] = v
    if not held:
        return []
    missing = [i for i, e in enumerate(entries) if e is None]
    if missing:
        raise ValueError(f"the shards do not hold `{what}` of parameters {missing}")
    return entries
