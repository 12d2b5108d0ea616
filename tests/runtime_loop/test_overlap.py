"""The overlapped gradient averaging (`mloc.runtime.base.overlap`) with a fake collective
(no process group). The two-process equality of the overlapped and flat paths is in
`test_overlap_nproc.py` (slow); the plan's `--nproc` lines in `tests/planner/test_parallel.py`."""

from __future__ import annotations

import pytest
import torch

from mloc.runtime.base import tree
from mloc.runtime.base.overlap import Bucketer, OverlappedSync, averaged_grad


class FakeSum:
    """A collective over ``world`` identical replicas: each sum is the tensor times ``world``.
    It records the bucket sizes in launch order and whether each launch came while autograd
    was still running (``running`` is set around the backward by the test)."""

    def __init__(self, world: int = 2):
        self.world, self.launched, self.during, self.running = world, [], [], False

    def __call__(self, t):
        t.mul_(self.world)
        self.launched.append(t.numel())
        self.during.append(self.running)
        return self

    def wait(self) -> None:
        pass


def _mlp(widths=(8, 16, 16, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(b, a, generator=g, requires_grad=True) for a, b in zip(widths, widths[1:])]
    return ws, torch.randn(5, widths[0], generator=g)


def _loss(ws, x):
    for w in ws:
        x = torch.tanh(x @ w.T)
    return x.square().sum()


def test_a_bucket_closes_once_it_reaches_the_cap_one_dtype_each_launched_last_first():
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(30), torch.zeros(4, dtype=torch.float64), torch.zeros(5)]
    layout = Bucketer.of(ts, cap_bytes=80)       # 20 float32 elements
    assert layout.buckets == ((4,), (3,), (2,), (0, 1))
    assert layout.sizes == (5, 4, 30, 20)
    assert Bucketer.of(ts).buckets == ((3,), (0, 1, 2, 4))     # 25 MiB: one per dtype


def _ddp_assignment(tensors, limits):
    """DDP's own bucket assignment (what its constructor computes), in launch order."""
    import torch.distributed as dist
    buckets, _ = dist._compute_bucket_assignment_by_size(list(tensors), limits)
    return tuple(tuple(b) for b in reversed(buckets))


@pytest.mark.parametrize("seed", range(6))
def test_buckets_are_ddps_for_random_models(seed):
    g = torch.Generator().manual_seed(seed)
    dtypes = (torch.float32, torch.float32, torch.float64, torch.float16)
    ts = [torch.empty(int(torch.randint(1, 300_000, (1,), generator=g)),
                      dtype=dtypes[int(torch.randint(0, 4, (1,), generator=g))], device="meta")
          for _ in range(int(torch.randint(1, 40, (1,), generator=g)))]
    first, cap = 2**20, 3 * 2**20
    assert Bucketer.of(ts, cap, first_bytes=first).buckets == _ddp_assignment(ts, [first, cap])
    assert Bucketer.of(ts, cap).buckets == _ddp_assignment(ts, [cap])     # a cap of one's own: no small first
    default = Bucketer.of(ts).buckets
    assert default == _ddp_assignment(ts, [2**20, 25 * 2**20])


def test_the_overlapped_average_is_the_gradient_and_launches_during_the_backward():
    ws, x = _mlp()
    want = torch.autograd.grad(_loss(ws, x), ws)
    fake = FakeSum()
    sync = OverlappedSync(2, all_reduce=fake, cap_bytes=64)   # each weight over the cap: one per bucket

    def spy(g):
        fake.running = True
    handle = ws[0].register_hook(spy)            # the first layer's gradient comes last
    got = sync.grad(_loss(ws, x), ws)
    handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert fake.launched == [4 * 16, 16 * 16, 16 * 8]     # bucket order: the last layer first
    assert fake.during[:2] == [False, False]     # launched before the first layer's gradient existed
    assert sync.counts == {None: 3}


def test_the_flat_path_gives_the_same_numbers_with_one_collective():
    ws, x = _mlp()
    fake = FakeSum()
    flat = OverlappedSync(2, overlap=False, all_reduce=fake).grad(_loss(ws, x), ws)
    over = OverlappedSync(2, all_reduce=FakeSum(), cap_bytes=64).grad(_loss(ws, x), ws)
    assert all(torch.equal(a, b) for a, b in zip(flat, over))
    assert fake.launched == [sum(w.numel() for w in ws)]


def test_an_unreached_input_is_zeros_marked_absent_and_every_bucket_still_sent():
    ws, x = _mlp()
    unused = torch.ones(3, requires_grad=True)
    fake = FakeSum()
    sync = OverlappedSync(2, all_reduce=fake, cap_bytes=64)
    got = sync.grad(_loss(ws, x), (*ws, unused), final=True)
    assert torch.equal(got[-1], torch.zeros(3)) and tree.absent(got) == (3,)
    assert len(fake.launched) == len(Bucketer.of((*ws, unused), 64).buckets)
    assert sync.reduced(got) and not sync.reduced(got)       # consumed once
    assert not sync.reduced(tuple(g.clone() for g in got))


def test_counts_are_per_problem_and_per_outer_step():
    ws, x = _mlp()
    sync = OverlappedSync(2, all_reduce=FakeSum())
    for owner in ("net", "net", "weights"):
        sync.owner = owner
        sync.grad(_loss(ws, x), ws)
    sync.owner = "weights"
    sync.mean([torch.ones(2), torch.ones(2, dtype=torch.float64)])     # two dtypes: two collectives
    assert sync.take(2) == {"net": 1.0, "weights": 1.5}
    assert sync.take(3) == {}


def test_one_process_and_a_hand_written_average_need_no_group():
    ws, x = _mlp()
    want = torch.autograd.grad(_loss(ws, x), ws)
    assert all(torch.equal(a, b) for a, b in zip(OverlappedSync(1).grad(_loss(ws, x), ws), want))
    halved = averaged_grad(lambda gs: tuple(g / 2 for g in gs), _loss(ws, x), ws)
    assert all(torch.equal(a, b / 2) for a, b in zip(halved, want))
