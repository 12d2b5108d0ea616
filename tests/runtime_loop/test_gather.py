"""Gathered batches: a DataLoader over a TensorDataset, drawn with one indexing per tensor,
gives the original loader's batches bitwise (values, dtypes, strides, order over epochs),
resumes exactly, shards as before, and is used only where that holds."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from mloc.runtime.program.data import DataStream
from mloc.runtime.program.gather import gatherable, gathered_loader


def tensors(n=23):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(n, 4, 3, generator=g), torch.randint(0, 5, (n,), generator=g),
            torch.rand(n, generator=g, dtype=torch.float64) > 0.5)


def loader(batch_size=5, shuffle=True, drop_last=False, seed=11, **kw):
    return DataLoader(TensorDataset(*tensors()), batch_size=batch_size, shuffle=shuffle,
                      drop_last=drop_last, generator=torch.Generator().manual_seed(seed), **kw)


def same(a, b):
    return (type(a) is type(b) and len(a) == len(b)
            and all(torch.equal(x, y) and x.dtype == y.dtype and x.stride() == y.stride() for x, y in zip(a, b)))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_gathered_batches_are_the_loaders_own_over_several_epochs(shuffle, drop_last):
    original, gathered = loader(shuffle=shuffle, drop_last=drop_last), gathered_loader(
        loader(shuffle=shuffle, drop_last=drop_last))
    want = [b for _ in range(3) for b in original]
    got = [b for _ in range(3) for b in gathered]
    assert len(want) == len(got) == 3 * (4 if drop_last else 5)
    assert all(same(a, b) for a, b in zip(want, got))
    if shuffle:     # the epochs really are shuffled, so the order is what is being compared
        assert not torch.equal(want[0][1], want[len(want) // 3][1])


def test_a_stream_gathers_and_resumes_at_every_position_exactly():
    whole = DataStream("p", loader)
    assert isinstance(whole.data.dataset, TensorDataset) and type(whole.data.dataset) is not TensorDataset
    want = [whole.next() for _ in range(13)]
    reference = loader()
    assert all(same(a, b) for a, b in zip(want, [b for _ in range(3) for b in reference]))
    for k in range(13):
        part = DataStream("p", loader)
        for _ in range(k):
            part.next()
        again = DataStream("p", loader)
        again.restore(part.state())
        assert all(same(a, again.next()) for a in want[k:])


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_streams_gather_the_same_shards(world):
    def plain(rank):    # the shards an ungathered loader would give: its dataset is not a TensorDataset
        class Rows(torch.utils.data.Dataset):
            def __init__(self):
                self.t = tensors()

            def __len__(self):
                return len(self.t[0])

            def __getitem__(self, i):
                return tuple(t[i] for t in self.t)
        return DataStream("p", lambda: DataLoader(Rows(), batch_size=3, shuffle=True,
                                                  generator=torch.Generator().manual_seed(5)),
                          rank=rank, world=world, seed=9)
    for rank in range(world):
        gathered = DataStream("p", lambda: loader(batch_size=3, seed=5), rank=rank, world=world, seed=9)
        reference = plain(rank)
        assert type(gathered.data.dataset) is not TensorDataset
        assert all(same(list(reference.next()), gathered.next()) for _ in range(12))


@pytest.mark.parametrize("change", [
    dict(collate_fn=lambda b: b),                       # the user's own collate: theirs to run
    dict(num_workers=1),                                # workers fetch: left as it is
    dict(batch_size=None),                              # no automatic batching
])
def test_only_loaders_whose_batches_stay_the_same_are_gathered(change):
    plain = loader(**change)
    assert gatherable(loader()) and not gatherable(plain)
    with pytest.raises(ValueError, match="TensorDataset"):
        gathered_loader(plain)


def test_a_subclassed_dataset_keeps_its_own_getitem():
    class Doubled(TensorDataset):
        def __getitem__(self, i):
            return tuple(2 * t[i] for t in self.tensors)
    data = DataLoader(Doubled(*tensors()), batch_size=4)
    assert not gatherable(data)
    assert torch.equal(DataStream("p", lambda: data).next()[1], 2 * tensors()[1][:4])
