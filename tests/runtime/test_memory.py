"""`PeakMemory`, the allocator-level measurement the planner is calibrated against, checked
against closed forms: every count below is the exact number of bytes the code allocates."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from mloc.runtime.base.memory import PeakMemory, peak_bytes

F32, F64 = 4, 8


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_allocations_and_frees_in_order(device):
    with PeakMemory() as m:
        a = torch.empty(1000, device=device)                     # 4000
        c = a * 2                                                # 8000
        del a                                                    # 4000
        d = torch.zeros(500, dtype=torch.float64, device=device)  # 8000
        e = torch.ones(3000, device=device)                      # 20000: the peak
        del c, e                                                 # 4000
        assert m.live == 500 * F64
    assert (m.peak, m.live, m.count, m.allocated) == (20000, 4000, 4, 4000 + 4000 + 4000 + 12000)
    del d


def test_views_are_not_counted_twice_nor_views_of_what_existed():
    x = torch.randn(100, 10)
    with PeakMemory() as m:
        a = torch.empty(100, 10)
        views = [a.view(1000), a[3:], a.t(), a.transpose(0, 1).reshape(10, 100)[0], a.detach(), a.unsqueeze(0),
                 *a.split(10), *a.unbind(1), a.expand(2, 100, 10)]
        olds = [x.view(1000), x[5:], x.t(), x.detach(), x.narrow(0, 1, 2), *x.chunk(4)]
        del a                                                    # the views hold the storage
        assert m.live == 100 * 10 * F32
        del views
        assert m.live == 0
    assert (m.peak, m.count) == (4000, 1) and olds


def test_in_place_operations_and_outs_allocate_nothing_unless_they_resize():
    x, y = torch.randn(1000), torch.randn(1000)
    before = torch.empty(10)
    with PeakMemory() as m:
        x.add_(1).mul_(2).clamp_(-1, 1)
        x[:10].copy_(y[:10])
        index = torch.tensor([0, 1])                             # 2 int64 = 16 (made outside any op, lifted)
        x.index_fill_(0, index, 0.0)
        torch.add(x, y, out=y)
        torch.mul(x[:10], 2, out=before)                         # the right size: nothing
        assert m.live == 16
        grown = torch.mul(x, 2, out=torch.empty(0))              # empty(0), then resized to 4000
        before.resize_(1000)                                     # a tensor from before grows by 3960
    assert m.live == 16 + 4000 + 3960
    assert grown.untyped_storage().nbytes() == 4000


def test_a_forward_and_backward():
    """``((x * w).sum()).backward()``: the product is saved by nobody (mul saves its inputs,
    which existed), so after the forward only the loss lives; after the backward, the
    loss and ``w.grad``; at the peak also the gradient of the loss (4 bytes)."""
    x, w = torch.randn(1000), torch.randn(1000, requires_grad=True)
    with PeakMemory() as m:
        loss = (x * w).sum()
        assert m.live == F32                                      # the product was freed
        loss.backward()
    assert m.live == F32 + 1000 * F32 and m.peak == m.live + F32
    assert w.grad is not None


def test_what_autograd_saves_is_alive_until_the_graph_goes():
    x = torch.randn(200, 50, requires_grad=True)
    with PeakMemory() as m:
        h = torch.relu(x @ torch.ones(50, 30))                   # ones 6000, x @ ones 24000, relu 24000
        loss = h.pow(2).sum()                                    # pow saves h; the square 24000 is freed
        assert m.live == 50 * 30 * F32 + 200 * 30 * F32 + F32    # ones (saved by mm) + relu's output + loss
        del h, loss                                              # the graph goes: everything is freed
        gc.collect()
    assert m.live == 0
    # at the relu: ones, mm's output, relu's; mm's output is then freed (relu saves its own
    # output), and the square takes its place, beside the sum
    assert m.peak == 6000 + 24000 + 24000 + F32


def test_inside_torch_func_transforms():
    """The mode sees the plain tensors under ``vmap`` and ``jvp``."""
    xs = torch.randn(8, 100)
    with PeakMemory() as m:
        out = torch.func.vmap(lambda x: x * 2)(xs)
    assert m.live == 8 * 100 * F32 and out.shape == (8, 100)
    p, t = torch.randn(100), torch.ones(100)
    with PeakMemory() as m:
        primal, tangent = torch.func.jvp(lambda q: q * 3, (p,), (t,))
    assert m.live == 2 * 100 * F32


def test_peak_bytes_and_other_threads():
    assert peak_bytes(lambda: torch.empty(256)) == 256 * F32  # its result is dropped at the end
    outside = []
    with PeakMemory() as m:
        worker = threading.Thread(target=lambda: outside.append(torch.empty(1000)))
        worker.start()
        worker.join()
    assert m.peak == 0 and outside                           # another thread's work is not seen (documented)


def test_detail_lists_what_is_alive_at_the_peak():
    with PeakMemory(detail=True) as m:
        a = torch.zeros(10)
        b = torch.ones(20)
        del a, b
        torch.empty(5)
    assert m.at_peak == [("aten.ones.default", 80), ("aten.zeros.default", 40)]
