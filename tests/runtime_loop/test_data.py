"""DataStream: endless epochs, device moves, exact resume, sharding across ranks."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from mloc.runtime.program.data import DataStream, distributed_loader, to_device
from mloc.shared.warning import MlocWarning


class Counting(Dataset):
    """Example i is i; counts how many examples were loaded."""

    def __init__(self, n: int):
        self.n, self.loads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loads += 1
        return torch.tensor(i)


def seeded(n=10, batch_size=3, shuffle=True, drop_last=False, seed=7, dataset=None):
    return lambda: DataLoader(dataset if dataset is not None else Counting(n), batch_size=batch_size,
                              shuffle=shuffle, drop_last=drop_last,
                              generator=torch.Generator().manual_seed(seed))


def draws(stream, k):
    return [stream.next().tolist() for _ in range(k)]


def test_restarts_and_counts_epochs():
    s = DataStream("p", seeded(n=6, batch_size=3, shuffle=False))
    assert draws(s, 5) == [[0, 1, 2], [3, 4, 5]] * 2 + [[0, 1, 2]]
    assert s.state() == {"epoch": 2, "index": 1, "world": 1}


def test_shuffled_epochs_differ_and_cover_the_data():
    s = DataStream("p", seeded(n=9, batch_size=3))
    e0, e1 = draws(s, 3), draws(s, 3)
    assert e0 != e1
    assert sorted(sum(e0, [])) == sorted(sum(e1, [])) == list(range(9))


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_every_position_matches_an_uninterrupted_run(drop_last):
    factory = seeded(n=10, batch_size=3, drop_last=drop_last)
    full = DataStream("p", factory)
    reference = draws(full, 20)                   # 5-7 epochs, crossing several boundaries
    states, s = [], DataStream("p", factory)
    for _ in range(20):
        states.append(s.state())
        s.next()
    for k, state in enumerate(states):
        resumed = DataStream("p", factory)
        resumed.restore(state)
        assert resumed.state() == state
        assert draws(resumed, 20 - k) == reference[k:], f"resumed at {state}"


def test_restoring_replays_earlier_epochs_without_loading_data():
    ds = Counting(12)
    s = DataStream("p", seeded(dataset=ds, batch_size=4))
    ds.loads = 0
    s.restore({"epoch": 5, "index": 2})
    assert ds.loads == 8                          # only the 2 batches of the current epoch


@pytest.mark.parametrize("one_shot", [False, True])
def test_restore_of_a_plain_iterable_replays_it(one_shot):
    factory = (lambda: iter(torch.arange(5).split(1))) if one_shot else (lambda: torch.arange(5).split(1))
    s = DataStream("gen", factory)
    reference = draws(s, 12)
    assert reference == [[i] for i in range(5)] * 2 + [[0], [1]]
    r = DataStream("gen", factory)
    r.restore({"epoch": 1, "index": 3})
    assert draws(r, 4) == reference[8:12]


def test_empty_data_is_reported_not_looped_forever():
    with pytest.raises(ValueError, match="yields no batches"):
        DataStream("p", lambda: []).next()


def test_restoring_past_the_end_of_an_epoch_is_reported():
    s = DataStream("p", seeded(n=6, batch_size=3))
    with pytest.raises(ValueError, match="only 2 batches"):
        s.restore({"epoch": 0, "index": 5})


def test_restoring_an_unseeded_shuffle_warns():
    s = DataStream("p", lambda: DataLoader(Counting(6), batch_size=2, shuffle=True))
    with pytest.warns(MlocWarning, match="without a seeded generator"):
        s.restore({"epoch": 1, "index": 0})


def test_to_device_reaches_nested_tensors():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": (torch.ones(1), [torch.zeros(2), "tag"]), "b": Pair(torch.ones(1), 3)}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"][0].is_meta and moved["a"][1][0].is_meta and moved["a"][1][1] == "tag"
    assert isinstance(moved["b"], Pair) and moved["b"].x.is_meta and moved["b"].y == 3
    assert to_device(batch, None) is batch


def test_stream_moves_batches_to_its_device():
    s = DataStream("p", lambda: [(torch.ones(2), torch.zeros(1))], device="meta")
    x, y = s.next()
    assert x.is_meta and y.is_meta


# --- sharding ---------------------------------------------------------------------------

def tensor_loader(n, batch_size, shuffle, drop_last=False):
    return lambda: DataLoader(TensorDataset(torch.arange(n)), batch_size=batch_size, shuffle=shuffle,
                              drop_last=drop_last, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n", [40, 37])
def test_two_ranks_with_batch_b_see_what_one_process_with_batch_2b_sees(shuffle, n):
    B, steps = 4, 12                               # several epochs
    ranks = [DataStream("p", tensor_loader(n, B, shuffle, drop_last=True), rank=r, world=2, seed=5)
             for r in range(2)]
    one = DataStream("p", lambda: distributed_loader(tensor_loader(n, 2 * B, shuffle, drop_last=True)(),
                                                     0, 1, seed=5))
    for _ in range(steps):
        (a,), (b,) = ranks[0].next(), ranks[1].next()
        (both,) = one.next()
        assert not set(a.tolist()) & set(b.tolist())
        assert sorted(a.tolist() + b.tolist()) == sorted(both.tolist())
        assert torch.equal(torch.stack([a, b], 1).reshape(-1), both)   # interleaved, as documented
    position = lambda s: {k: v for k, v in s.state().items() if k != "world"}   # noqa: E731
    assert position(ranks[0]) == position(ranks[1]) == position(one)


def test_without_shuffle_rank_r_takes_the_interleaved_slice():
    s = DataStream("p", tensor_loader(10, 2, False), rank=1, world=2)
    assert [b[0].tolist() for b in (s.next(), s.next(), s.next())] == [[1, 3], [5, 7], [9]]


def test_sharded_stream_resumes_exactly():
    factory = tensor_loader(23, 3, True)
    full = DataStream("p", factory, rank=1, world=3, seed=2)
    reference = [full.next()[0].tolist() for _ in range(12)]     # 3 batches (3, 3, 1) per epoch
    r = DataStream("p", factory, rank=1, world=3, seed=2)
    r.restore({"epoch": 3, "index": 1})
    assert [r.next()[0].tolist() for _ in range(2)] == reference[10:12]


def test_a_position_written_by_another_number_of_processes_is_rescaled_with_a_warning():
    factory = tensor_loader(48, 4, True)
    two = DataStream("p", factory, rank=0, world=2, seed=2)
    [two.next() for _ in range(3)]                                     # 6 per epoch per rank
    saved = two.state()
    assert saved == {"epoch": 0, "index": 3, "world": 2}
    three = DataStream("p", factory, rank=1, world=3, seed=2)
    with pytest.warns(MlocWarning, match=r"batch 3 of epoch 0 on each of 2 .*resumes at batch 2"):
        three.restore(saved)                                           # 2·3 = 6 per-rank batches = 3·2
    fresh = DataStream("p", factory, rank=1, world=3, seed=2)
    assert [three.next()[0].tolist() for _ in range(3)] == [fresh.next()[0].tolist() for _ in range(5)][2:]


def test_a_rescaled_position_past_its_epochs_end_goes_on_with_the_next_epoch():
    factory = tensor_loader(70, 16, True)          # 2 ranks: 35 each, 3 batches; 1 process: 5 batches
    one = DataStream("p", factory, seed=2)
    with pytest.warns(MlocWarning, match="resumes at batch 6"):
        one.restore({"epoch": 0, "index": 3, "world": 2})
    fresh = DataStream("p", factory, seed=2)
    assert one.next()[0].tolist() == [fresh.next()[0].tolist() for _ in range(6)][5]   # epoch 1's first
    assert one.state() == {"epoch": 1, "index": 1, "world": 1}


def test_a_position_without_its_world_is_this_streams_own():
    import warnings
    s = DataStream("p", tensor_loader(23, 3, True), rank=1, world=3, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.restore({"epoch": 1, "index": 2})
    assert s.state() == {"epoch": 1, "index": 2, "world": 3}


def test_other_iterables_are_sharded_by_every_wth_batch():
    batches = [torch.tensor([i]) for i in range(7)]
    seen = [[DataStream("p", lambda: batches, rank=r, world=3).next().item() for _ in range(1)]
            for r in range(3)]
    assert seen == [[0], [1], [2]]
    s = DataStream("p", lambda: batches, rank=2, world=3)
    assert [s.next().item() for _ in range(4)] == [2, 5, 2, 5]    # batch 6: incomplete group, dropped
