"""Endless, resumable, shardable batch streams: what a problem's ``data`` becomes at run time.

A problem's data object is any iterable of batches, typically a
:class:`torch.utils.data.DataLoader`, built by a zero-argument ``factory``. A
:class:`DataStream` draws one batch per :meth:`~DataStream.next`, restarts the iterable
when it is exhausted (counting epochs; a one-shot iterator is rebuilt by the factory) and
moves tensors (also inside tuples, lists and
dicts) to its device.

**Resuming.** :meth:`~DataStream.state` is ``{"epoch": e, "index": i}`` (``i`` batches drawn
in epoch ``e``). :meth:`~DataStream.restore` rebuilds the iterable from the factory and
replays epochs ``0..e-1`` in order, then draws ``i`` batches of epoch ``e``, so the next
batch is exactly the one an uninterrupted run would draw. This relies on the data object
being **deterministic**: the factory builds the same object every time, and a shuffling
DataLoader has a seeded ``generator`` (the example programs' loaders do). A seeded
DataLoader's shuffle order depends on how many epochs were started before (each
``iter()`` and each permutation draws from its generator), which is why past epochs are
replayed rather than skipped. For a DataLoader over a map-style dataset the replay of past
epochs goes through the loader's own sampler and generator with a stand-in dataset, so it
loads no data; only the ``i`` batches of the current epoch are loaded. Any other iterable
is replayed by drawing its batches. A position written by another number of processes
(``world`` in the state) is rescaled to the same count of batches drawn over all ranks,
``⌊saved·i/world⌋`` per rank (past the epoch's end: the next epoch's start), with a warning:
the batch order depends on the number of processes, so such a resume continues the run
rather than repeating it. (A DataLoader with ``persistent_workers`` draws its
generator differently after the first epoch, so it is replayed by drawing too.)

**Sharding.** With ``world > 1``, a DataLoader over a map-style dataset with the default
sampler (sequential, or shuffling without replacement) is rebuilt by
:func:`distributed_loader` with a ``DistributedSampler(dataset, num_replicas=world,
rank=rank, shuffle=<as the original>, seed=seed, drop_last=True)`` and the original batch
size, ``drop_last``, collate function and worker settings. Let ``N`` be the dataset size,
``M = world·⌊N/world⌋``, ``B`` the batch size, and ``P_e`` the order of epoch ``e``:
``torch.randperm(N, generator=torch.Generator().manual_seed(seed + e))`` when shuffling,
``range(N)`` otherwise, truncated to its first ``M`` entries. Rank ``r``'s ``k``-th batch
of epoch ``e`` holds the examples ``P_e[world·(k·B + j) + r]`` for ``j = 0..B-1``, so the
``world`` ranks together see ``P_e[world·k·B : world·(k+1)·B]``: exactly batch ``k`` of
``distributed_loader(loader_with_batch_size_world·B, 0, 1, seed)`` in one process.
(With ``drop_last=False`` and ``N`` not divisible by ``world·B``, the last, partial batch
misses the ``N - M`` examples that the DistributedSampler drops.) Every rank draws the same
number of batches per epoch, so the ranks stay in lockstep. Note that this order differs
from the single-process order of the original loader, which keeps its own sampler.

Any other iterable (an ``IterableDataset`` loader, a custom sampler, a Python generator)
is sharded by batches: rank ``r`` takes batches ``r, r + world, r + 2·world, ...`` of each
epoch, reading them in groups of ``world`` and dropping a trailing incomplete group (every
rank then draws the same number of batches); each rank reads, and discards, the other
ranks' batches, so the iterable must yield the same sequence in every process. A loader
that already uses a ``DistributedSampler`` is taken as sharded and used as it is (its
``set_epoch`` is called at every epoch, as for the rebuilt ones).

**Gathering.** A DataLoader over a ``TensorDataset`` is drawn by
:func:`~mloc.runtime.program.gather.gathered_loader`: the same batches, one indexing per
tensor instead of one per example.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
import warnings
from itertools import islice
from typing import Any

import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset,
                              RandomSampler, SequentialSampler)

from mloc.runtime.base.tree import map_tensors
from mloc.runtime.program.gather import gatherable, gathered_loader
from mloc.shared.warning import MlocWarning


class DataStream:
    """An endless stream of batches of one problem's data object (see the module docstring).

    ``factory()`` builds the data object (called again by :meth:`restore`). ``device``
    (``None``: leave batches where they are) receives every tensor of each batch.
    ``rank``/``world`` shard the data across processes; ``seed`` seeds the distributed
    sampler's shuffle (use the train block's seed, the same on every rank).
    """

    def __init__(self, name: str, factory: Callable[[], Iterable], *, device=None,
                 rank: int = 0, world: int = 1, seed: int = 0):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"data stream `{name}`: need 0 <= rank < world, got rank={rank}, world={world}")
        self.name, self.device = name, None if device is None else torch.device(device)
        self.rank, self.world, self.seed = rank, world, seed
        self._factory = factory
        self._data = self._build()
        self._epoch, self._index, self._it = 0, 0, None

    def _build(self) -> Iterable:
        self._fresh = True
        data = self._factory()
        if self.world > 1 and _shardable(data):
            data = distributed_loader(data, self.rank, self.world, self.seed)
        return gathered_loader(data) if gatherable(data) else data

    @property
    def data(self) -> Iterable:
        """The data object the stream draws from (after sharding)."""
        return self._data

    def next(self) -> Any:
        """The next batch, on the stream's device; starts a new epoch when one is exhausted."""
        it = self._it
        if it is None:
            return to_device(self._draw(), self.device)
        try:        # the common case, inlined: the epoch goes on
            batch = next(it)
        except StopIteration:
            return to_device(self._draw(), self.device)
        self._index += 1
        return to_device(batch, self.device)

    def _draw(self) -> Any:
        if self._it is None:
            self._it = self._start(self._epoch)
        try:
            batch = next(self._it)
        except StopIteration:
            self._epoch, self._index = self._epoch + 1, 0
            self._it = self._start(self._epoch)
            try:
                batch = next(self._it)
            except StopIteration:
                where = f" for rank {self.rank} of {self.world}" if self.world > 1 else ""
                raise ValueError(f"the data of `{self.name}` yields no batches{where}") from None
        self._index += 1
        return batch

    def _start(self, epoch: int) -> Iterator:
        """A fresh iterator over epoch ``epoch`` (distributed samplers get ``set_epoch``); a
        one-shot iterator (a generator) is rebuilt from the factory for every epoch."""
        if not self._fresh and isinstance(self._data, Iterator):
            self._data = self._build()
        self._fresh = False
        sampler = _sampler_of(self._data)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        it = iter(self._data)
        if self.world > 1 and not _shardable_built(self._data):
            return _every_wth(it, self.rank, self.world)
        return it

    def state(self) -> dict:
        """``{"epoch": e, "index": i, "world": w}``: ``i`` batches drawn in epoch ``e`` by
        each of ``w`` processes (plain ints)."""
        return {"epoch": self._epoch, "index": self._index, "world": self.world}

    def restore(self, state: dict) -> None:
        """Rebuild from the factory and fast-forward to ``state`` (see the module docstring)."""
        epoch, index = int(state["epoch"]), int(state["index"])
        saved = int(state.get("world", self.world))       # before 2026-12-02: not recorded
        if saved != self.world:
            index = self._rescaled(epoch, index, saved)
        self._data = self._build()
        if _unseeded_shuffle(self._data):
            warnings.warn(MlocWarning(f"the data of `{self.name}` shuffles without a seeded generator, so "
                                      "the resumed batches differ from an uninterrupted run's; give its "
                                      "DataLoader generator=torch.Generator().manual_seed(...)"), stacklevel=2)
        for e in range(epoch):
            self._replay_epoch(e)
        self._epoch, self._index, self._it = epoch, 0, self._start(epoch)
        for _ in range(index):
            try:
                next(self._it)
            except StopIteration:
                if saved != self.world:         # the rescaled position is past this epoch's end
                    self._epoch, self._index, self._it = epoch + 1, 0, None
                    return
                raise ValueError(f"cannot restore the data of `{self.name}` to batch {index} of epoch "
                                 f"{epoch}: the epoch has only {self._index} batches; is the data "
                                 "object deterministic?") from None
            self._index += 1

    def _rescaled(self, epoch: int, index: int, saved: int) -> int:
        """A position written by ``saved`` processes, read by ``self.world``: the ``saved ·
        index`` per-rank batches drawn of epoch ``epoch`` are ``⌊saved · index / world⌋``
        batches of each of ``world`` ranks (the same examples where it divides; otherwise up to
        one batch per rank is drawn again). The batch order itself depends on the world size
        (see the module docstring), so such a resume continues the run, not bitwise."""
        rescaled = saved * index // self.world
        warnings.warn(MlocWarning(f"the data of `{self.name}` was at batch {index} of epoch {epoch} on each "
                                  f"of {saved} process(es); with {self.world} it resumes at batch {rescaled} of "
                                  "that epoch (the batch order depends on the number of processes, so this run "
                                  f"does not repeat the batches a {saved}-process run would draw)"), stacklevel=3)
        return rescaled

    def _replay_epoch(self, epoch: int) -> None:
        """Consume epoch ``epoch`` as a full run would, loading no data when possible."""
        stub = _index_only(self._data)
        if stub is None:
            for _ in self._start(epoch):
                pass
            return
        sampler = _sampler_of(self._data)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for _ in stub:
            pass


def cast_floating(batch: Any, dtype: torch.dtype) -> Any:
    """``batch`` with every floating-point tensor cast to ``dtype`` (a ``dtype`` run),
    through tuples (named too), lists and dicts; other tensors (integer labels, masks) and
    anything else as they are."""
    return map_tensors(batch, lambda t: t.to(dtype) if t.is_floating_point() else t)


def cast_data(value: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """``value``, data that the program's code made and mloc passes on to it (an
    evaluation's data argument), put where the run's batches are and as they are: every
    tensor moved to ``device`` (:func:`to_device`), then every floating-point one cast to
    ``dtype`` (:func:`cast_floating`); ``None`` leaves that side as it is:

    - a tensor, or a tuple, list or dict of them (nested; a batch): now;
    - an iterator (a generator): a generator yielding its items, each when drawn;
    - a DataLoader, an IterableDataset, or any other object that is iterated but not
      indexed (``__iter__`` without ``__getitem__``: a stream of tasks): a
      :class:`CastBatches` over it, iterable again and again, each batch moved and cast
      when drawn, nothing materialized;
    - anything else (a module, a number, a string, a numpy array, a map-style dataset)
      as it is.
    """
    if isinstance(value, (torch.Tensor, tuple, list, dict)):
        return _cast_batch(value, dtype, device)
    if isinstance(value, (nn.Module, str, bytes)):
        return value
    if isinstance(value, Iterator):
        return (_cast_batch(batch, dtype, device) for batch in value)
    if isinstance(value, (DataLoader, IterableDataset)) or (hasattr(value, "__iter__")
                                                            and not hasattr(value, "__getitem__")):
        return CastBatches(value, dtype, device)
    return value


def _cast_batch(batch: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    """One batch of :func:`cast_data`: moved, then cast (on the device: the copy is the
    smaller, float32 one)."""
    if device is not None:
        batch = to_device(batch, device)
    return batch if dtype is None else cast_floating(batch, dtype)


class CastBatches:
    """An iterable of batches (a DataLoader, say) whose batches are moved to ``device`` and
    cast to ``dtype`` as they are drawn (:func:`cast_data`; ``None``: that side as it is).
    ``len()`` and attributes (``.dataset``, ``.batch_size``) are the wrapped object's, so
    what is read through them is neither moved nor cast; ``isinstance(x, DataLoader)`` is
    False."""

    def __init__(self, data: Iterable, dtype: torch.dtype | None = None, device: torch.device | None = None):
        self._data, self._dtype, self._device = data, dtype, device

    def __iter__(self) -> Iterator:
        dtype, device = self._dtype, self._device
        return (_cast_batch(batch, dtype, device) for batch in self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, name: str) -> Any:     # a name the wrapper lacks: the wrapped object's
        data = self.__dict__.get("_data")
        if data is None:
            raise AttributeError(name)
        return getattr(data, name)

    def __repr__(self) -> str:
        return f"CastBatches({self._data!r}, dtype={self._dtype}, device={self._device})"


def to_device(batch: Any, device: torch.device | None) -> Any:
    """``batch`` with every tensor moved to ``device`` (``None``: unchanged)."""
    if device is None:
        return batch
    if type(batch) is tuple or type(batch) is list:  # the common case, already there: as it is
        cpu = device.type == "cpu"
        for t in batch:
            if type(t) is not torch.Tensor or not (t.is_cpu if cpu else t.device == device):
                break
        else:
            return batch
    return map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def distributed_loader(loader: DataLoader, rank: int, world: int, seed: int = 0) -> DataLoader:
    """``loader`` rebuilt over a ``DistributedSampler`` shard (see the module docstring).

    ``loader`` must be a DataLoader over a map-style dataset with the default batch
    sampler and a sequential or non-replacing random sampler (``ValueError`` otherwise).
    """
    if not _shardable(loader):
        raise ValueError("only a DataLoader over a map-style dataset with its default sampler can be "
                         "rebuilt over a DistributedSampler")
    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = DistributedSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=True)
    extra = {}
    if loader.num_workers > 0:
        extra = dict(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
                     multiprocessing_context=loader.multiprocessing_context)
    generator = loader.generator if loader.generator is not None else torch.Generator().manual_seed(seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                      drop_last=loader.drop_last, collate_fn=loader.collate_fn,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      generator=generator, **extra)


def _shardable(data) -> bool:
    """A DataLoader that :func:`distributed_loader` can rebuild faithfully."""
    if not isinstance(data, DataLoader) or isinstance(data.dataset, IterableDataset):
        return False
    if data.batch_size is None or type(data.batch_sampler) is not BatchSampler:
        return False
    sampler = data.sampler
    if type(sampler) is SequentialSampler:
        return True
    return (type(sampler) is RandomSampler and not sampler.replacement
            and sampler.num_samples == len(data.dataset))


def _unseeded_shuffle(data) -> bool:
    """A DataLoader whose shuffle order comes from the global RNG (not reproducible here)."""
    sampler = _sampler_of(data)
    return isinstance(sampler, RandomSampler) and sampler.generator is None


def _shardable_built(data) -> bool:
    """Whether ``data`` is already a DistributedSampler shard (no batch striding needed)."""
    return isinstance(data, DataLoader) and isinstance(_sampler_of(data), DistributedSampler)


def _sampler_of(data):
    if not isinstance(data, DataLoader):
        return None
    return data.batch_sampler.sampler if data.batch_sampler is not None else data.sampler


class _Indices(torch.utils.data.Dataset):
    """A stand-in map-style dataset: index ``i`` is ``None`` (nothing is loaded)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return None


def _collate_nothing(batch):
    return None


def _index_only(data) -> DataLoader | None:
    """A loader that draws ``data``'s sampler and generator exactly as ``data`` does, loading
    nothing; ``None`` when that cannot be guaranteed (not a map-style DataLoader, or
    persistent workers, whose generator use differs after the first epoch)."""
    if not isinstance(data, DataLoader) or isinstance(data.dataset, IterableDataset):
        return None
    if data.persistent_workers and data.num_workers > 0:
        return None
    stub = _Indices(len(data.dataset))
    if data.batch_sampler is not None:
        return DataLoader(stub, batch_sampler=data.batch_sampler, generator=data.generator,
                          collate_fn=_collate_nothing)
    return DataLoader(stub, sampler=data.sampler, batch_size=None, generator=data.generator,
                      collate_fn=_collate_nothing)


def _every_wth(it: Iterator, rank: int, world: int) -> Iterator:
    """Batches ``rank, rank + world, ...`` of ``it``, read in complete groups of ``world``."""
    while True:
        group = list(islice(it, world))
        if len(group) < world:
            return
        yield group[rank]
