"""Batches of a ``TensorDataset`` drawn by gathering: one indexing per tensor, not per example.

A DataLoader over a :class:`~torch.utils.data.TensorDataset` with the
default collate function and no worker processes loads a batch of ``B`` examples as ``B``
calls of ``dataset[i]`` (each ``(t[i] for t in tensors)``) and a ``torch.stack`` per tensor.
:func:`gathered_loader` rebuilds it so that a batch is one indexing ``t[idx]`` per tensor
(``idx`` the batch's indices as one index tensor), through the loader's own batch sampler and
generator: the same indices, drawn from the generator exactly as the original loader draws
them, and the same values, dtypes and strides (both are fresh contiguous copies of the same
rows), so runs and their resumption are bitwise unchanged. What goes is the per-example
Python loop (``python3 bench/data_gather.py`` times both ways).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils.collate import default_collate


def gathered_loader(loader: DataLoader) -> DataLoader:
    """``loader`` drawing each batch with one indexing per tensor (see the module docstring):
    its batch sampler and generator, a :class:`_Gathering` view of its dataset, ``pin_memory``
    as it was. ``loader`` must satisfy :func:`gatherable` (``ValueError`` otherwise)."""
    if not gatherable(loader):
        raise ValueError("only a DataLoader over a TensorDataset with the default collate function "
                         "and no worker processes can draw its batches by gathering")
    return DataLoader(_Gathering(*loader.dataset.tensors), batch_sampler=loader.batch_sampler,
                      generator=loader.generator, collate_fn=_as_drawn, pin_memory=loader.pin_memory)


class _Gathering(TensorDataset):
    """A TensorDataset whose batches are fetched whole: ``__getitems__`` (which the loader's
    fetcher calls with a batch's indices) returns ``[t[idx] for t in tensors]``, the list that
    the default collate function makes of ``[dataset[i] for i in idx]``."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [t[idx] for t in self.tensors]


def _as_drawn(batch):
    return batch


def gatherable(data) -> bool:
    """A DataLoader that :func:`gathered_loader` can rebuild with the same batches."""
    return (isinstance(data, DataLoader) and type(data.dataset) is TensorDataset
            and data.collate_fn is default_collate and data.batch_sampler is not None
            and data.num_workers == 0)
