"""Peak tensor memory of a piece of code, counted at the allocator's grain: every storage.

``with PeakMemory() as m: step()`` then ``m.peak``: the most bytes of tensor storage that
were allocated inside the block and alive at the same moment (so the baseline is what
existed when the block began: parameters, optimizer states, data already drawn are not
counted; what the block allocates and frees, or keeps, is). Counted on every device, the
`meta` device included (the compiler measures a loss there without running it), by the
storages' own byte sizes.

How: a ``TorchDispatchMode`` sees every aten operation that runs while the block is active,
forward and backward (autograd's engine runs the backward of CPU tensors in the calling
thread, under the same mode), factories included, inside ``torch.func`` transforms too
(the mode sits below the transforms and sees the plain tensors they unwrap to). Each
output tensor's untyped storage is counted once, when first seen: not when the output
is an alias of an input (the schema says so: views, in-place and ``out=`` ops) or shares
an input's storage, nor again for a storage already counted (a view of a fresh tensor);
a tensor an in-place or ``out=`` operation resizes counts its growth.
Its release is a ``weakref.finalize`` on the storage object, which torch keeps unique per
storage and alive exactly as long as the storage (views and autograd's saved tensors
hold it), so the bytes leave the count when the last reference goes. ``torch.profiler``'s
memory view, which this replaces in the benchmarks, replays allocator events and missed
allocations (both batches of every outer step on Meta-Weight-Net, an activation of a
Hessian-vector product's backward: bench/README.md).

What it does not see: memory a kernel allocates for itself and frees before returning
(scratch space of a matrix product), storages made without an aten operation
(``torch.from_numpy``, deserialisation), operations run by other threads or processes
(DataLoader workers, Shampoo's root workers), and code compiled by ``torch.compile`` as
it runs without the mode (on a small function under the mode it ran its operations one
by one, as eager code does, so the count is eager memory, not the compiled kernels'). Storages that existed before the block and are freed inside it are not
subtracted: the peak is what the block adds, not the process's net.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory", "peak_bytes"]


class PeakMemory(TorchDispatchMode):
    """Live and peak bytes of the storages allocated while active (see the module docstring).

    ``live``: bytes allocated in the block and still alive; ``peak``: the most of them alive
    at once; ``allocated``: every byte allocated (freed or not); ``count``: storages. With
    ``detail=True``, ``at_peak`` lists what was alive at the peak, ``(operation, bytes)``
    by storage, the largest first (what a cost model is calibrated from)."""

    def __init__(self, detail: bool = False):
        super().__init__()
        self.live = self.peak = self.allocated = self.count = 0
        self._sizes: dict[int, int] = {}         # id of each storage counted -> its bytes
        self._ops: dict[int, str] | None = {} if detail else None
        self._at_peak: dict[int, tuple[str, int]] = {}
        self._op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = [(st, st.nbytes()) for st in map(_storage, _written(func, args, kwargs)) if st is not None]
        out = func(*args, **kwargs)
        for st, before in written:           # an in-place or `out=` operation that resized its tensor
            if st.nbytes() > before:
                self._grow(st, st.nbytes() - before)
        fresh = [s for s in map(_storage, _fresh_outputs(func, out)) if s is not None]
        if fresh:
            self._op = str(func)
            inputs = set() if func is _LIFT_FRESH else \
                {id(s) for s in map(_storage, tree_leaves((args, kwargs))) if s is not None}
            for s in fresh:
                if id(s) not in inputs:
                    self._count(s)
        return out

    def _count(self, storage) -> None:
        key, nbytes = id(storage), storage.nbytes()
        if key in self._sizes:                   # counted: a view of a fresh storage
            return
        if nbytes:
            self._grow(storage, nbytes)

    def _grow(self, storage, nbytes: int) -> None:
        """``nbytes`` more of ``storage`` are allocated: a new storage, or one resized (its
        growth only, when it existed before the block)."""
        key = id(storage)
        if key in self._sizes:
            self._sizes[key] += nbytes
        else:
            self._sizes[key] = nbytes
            if self._ops is not None:
                self._ops[key] = self._op
            self.count += 1
            weakref.finalize(storage, self._release, key)
        self._add(nbytes)

    def _add(self, nbytes: int) -> None:
        self.live += nbytes
        self.allocated += nbytes
        if self.live > self.peak:
            self.peak = self.live
            if self._ops is not None:
                self._at_peak = {k: (self._ops[k], n) for k, n in self._sizes.items()}

    def _release(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)
        if self._ops is not None:
            self._ops.pop(key, None)

    @property
    def at_peak(self) -> list[tuple[str, int]]:
        return sorted(self._at_peak.values(), key=lambda r: -r[1])


def _storage(t):
    """``t``'s untyped storage (one Python object per storage, kept by torch as long as the
    storage lives, so its id is the storage's while it lives), or None (not a tensor, or
    one without a storage: sparse; a zero tensor of forward-mode AD, which has no memory)."""
    if not isinstance(t, torch.Tensor) or t._is_zerotensor():
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


def _written(func, args, kwargs) -> list:
    """The tensors ``func`` may write to, and so resize (``Tensor(a!)`` in its schema: the
    self of an in-place operation, an ``out=``)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            out += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return out


def _fresh_outputs(func, out) -> list[torch.Tensor]:
    """The output tensors of ``func`` that its schema does not declare aliases of an input."""
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not tensors or func is _LIFT_FRESH:
        return tensors         # `torch.tensor(data)`: made outside any operation, then lifted
    schema = getattr(func, "_schema", None)
    if schema is None or len(schema.returns) != len(tensors):
        return tensors            # no schema to read (or a list return): the storage test decides
    return [t for t, r in zip(tensors, schema.returns) if r.alias_info is None]


def peak_bytes(fn: Callable[[], object]) -> int:
    """The peak bytes of tensor storage ``fn()`` allocates and holds at once (:class:`PeakMemory`);
    what ``fn`` returns is dropped before the count ends."""
    with PeakMemory() as m:
        fn()
    return m.peak
