"""Each tensor of a checkpoint cloned once, however many entries name it.

A checkpoint's problem entry holds ``params`` (the problem's trainable tensors) and
``module`` (the module's ``state_dict()``), and a problem's parameters are, most often, its
module's parameters: cloned for each entry they would be written twice. ``torch.save``
writes a storage once however many tensors of the payload share it, so :class:`Clones`
hands out one copy per distinct tensor, and the second entry refers to the first's copy:
each parameter's bytes are in the file once (and tied parameters, two ``state_dict`` keys
over one tensor, once too). The file format does not change: an entry is a tensor with the
same values either way, and the digest (:func:`mloc.runtime.program.checkpoint.digest`)
reads values, not storages. The copies are only ever read from (a restore copies *from*
them into the live tensors), so their sharing is never observed.

Two tensors are "the same" when they are the same view of the same memory: storage,
offset, shape, stride, dtype and device (:func:`view_key`), whether or not they are the same
Python object (``state_dict()`` hands out fresh ``detach()``\\ es). A sharded ``DTensor`` is
the same only as the same object (``state_dict(keep_vars=True)`` hands out the parameters
themselves): the copy of one is a collective (its all-gather), so every rank must make the
same choice, which a rank's local shard, empty when a parameter has fewer rows than there
are ranks, cannot tell. A tensor that is only another view of a
parameter (a flattened or sliced one) is a different view and keeps its own copy, as does
an empty one (its storage pointer says nothing).
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch.distributed.tensor import DTensor


def view_key(t: torch.Tensor) -> Hashable | None:
    """What identifies the memory ``t`` reads: ``(device, dtype, storage pointer, offset,
    shape, stride)``; a ``DTensor``: the object itself (a rank's local shard may be empty,
    and every rank must decide alike); None for an empty tensor, or one whose storage
    cannot be read (it is then never shared)."""
    if isinstance(t, DTensor):
        return ("dtensor", id(t))
    if t.numel() == 0 or t.is_meta or t.layout != torch.strided:
        return None
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(t.device), t.dtype, ptr, t.storage_offset(), tuple(t.shape), t.stride())


class Clones:
    """``clones(t)``: ``copy(t)`` the first time the memory ``t`` views is seen (its
    :func:`view_key`), the same copy after. ``copy`` (default ``t.detach().clone()``) is
    called once per distinct tensor, in first-seen order: the same order on every rank
    when the ranks see the same tensors in the same order, so a collective ``copy`` (an
    FSDP all-gather) stays matched."""

    def __init__(self, copy: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.copy = copy or (lambda t: t.detach().clone())
        self.seen: dict = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = view_key(t)
        if key is None:
            return self.copy(t)
        if key not in self.seen:        # ``t`` kept: its memory cannot be reused for another key
            self.seen[key] = (t, self.copy(t))
        return self.seen[key][1]
