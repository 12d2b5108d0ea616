"""`mloc.runtime.base.inductor_memory`: a graph's buffers as TorchInductor keeps them, against
closed forms, against the same graph run eagerly under `PeakMemory`, and (slow tier)
against the compiled graph's allocator events; `mloc.runtime.base.allocator.replay`."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from mloc.runtime.base.allocator import allocator_peak, replay
from mloc.runtime.base.memory import PeakMemory
from mloc.runtime.base.inductor_memory import buffer_bytes

N = 64
S = N * N * 8          # one N×N float64 buffer


def chain(a, b):
    """A matrix product, three pointwise operations on it, a reduction: fused, the
    pointwise values are never written (peak: the product and the sum's 8 bytes); eager,
    each is a buffer until the next one is made (peak: two at once)."""
    x = a @ b
    return ((torch.relu(x) * 2) + 1).sum()


def product_of_pointwise(a, b):
    """A pointwise value read by a matrix product must be a buffer: fused or not, two N×N
    buffers at once (the first product, then the pointwise value, then the second
    product with the first freed)."""
    x = a @ b
    y = torch.relu(x) * 2        # relu inlined into the product's operand, mul a buffer
    return (y @ b).sum()


def long_sum(a, b):
    """A sum built over 20 matrix products, ``x = q₀ + q₁ + ...`` with ``qᵢ₊₁ = qᵢ b`` (an
    unrolled solver's iterate): each partial sum is pointwise and has one reader, so it is
    inlined, and every ``qᵢ`` it reads stays alive until the sum (20 buffers). (Inductor
    writes ``x₁₂``, whose body reads 13 buffers, but fuses it into the sum's kernel: it is
    computed there, at the end.)"""
    q = x = a @ b
    for _ in range(19):
        q = q @ b
        x = x + q
    return x.sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, N, generator=g, dtype=torch.float64), torch.randn(N, N, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("fn,fused,unfused", [(chain, S + 8, 2 * S), (product_of_pointwise, 2 * S, 2 * S),
                                              (long_sum, 20 * S + 8, 3 * S)])
def test_closed_forms(fn, fused, unfused):
    graph = make_fx(fn)(*_inputs()).graph
    assert buffer_bytes(graph)[0] == fused
    assert buffer_bytes(graph, fused=False)[0] == unfused


def test_marks_are_the_bytes_alive_after_an_operation():
    graph = make_fx(product_of_pointwise)(*_inputs()).graph
    # after the first product: it; after the mul: the product freed (its last reader), y
    _, at = buffer_bytes(graph, [1, 3])
    assert at == [S, S]


@pytest.mark.parametrize("fn", [chain, product_of_pointwise])
def test_unfused_is_the_traced_graph_run_eagerly(fn):
    """A GraphModule frees each value after its last use, as the unfused replay assumes:
    `PeakMemory` over a real run of the traced graph reads the same bytes."""
    gm, inputs = make_fx(fn)(*_inputs()), _inputs()
    with PeakMemory() as mem:
        gm(*inputs)
    assert mem.peak == buffer_bytes(gm.graph, fused=False)[0]


def test_a_hessian_vector_product_keeps_less_compiled_than_eager():
    """An MLP's Hessian-vector product, traced on the meta device: fused and freed at last
    use it holds less than every value kept (a sanity bound, not a calibration)."""
    from mloc.runtime.base.inductor_memory import compiled_sizes

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).to("meta")
    x, y = torch.empty(8, 16, device="meta"), torch.zeros(8, dtype=torch.long, device="meta")
    params = list(net.parameters())
    sizes = compiled_sizes(lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), [net], (x, y), params,
                           params)
    assert set(sizes) == {"backward", "activations", "graph", "hvp"}
    assert 0 < sizes["activations"] <= sizes["backward"] and 0 < sizes["graph"] <= sizes["hvp"]


def test_replay_counts_only_what_the_block_allocates():
    events = [{"ts": 0, "args": {"Addr": 1, "Bytes": -100}},      # an earlier step's buffer, freed: not subtracted
              {"ts": 1, "args": {"Addr": 2, "Bytes": 40}},
              {"ts": 2, "args": {"Addr": 3, "Bytes": 30}},
              {"ts": 3, "args": {"Addr": 2, "Bytes": -40}},
              {"ts": 4, "args": {"Addr": 4, "Bytes": 50}}]
    assert replay(events) == 80


def test_the_allocator_reads_an_eager_block_as_peak_memory_does():
    """Plain tensor code: the allocator's events and `PeakMemory` agree, but for the 0-dim
    tensors Python's numbers become (`* 2`, `+ 1`: 8 bytes each, made without an aten
    operation, which `PeakMemory` does not see)."""
    a, b = _inputs()
    with PeakMemory() as mem:
        chain(a, b)
    assert mem.peak == 3 * S           # x, relu(x) and its double (`x` is held by the Python frame)
    assert 0 <= allocator_peak(lambda: chain(a, b)) - mem.peak <= 2 * 8


@pytest.mark.slow
@pytest.mark.parametrize("fn", [chain, product_of_pointwise, long_sum])
def test_the_compiled_graph_allocates_what_the_fused_replay_says(fn):
    """The same graph compiled by Inductor (as `mloc.runtime.compiled.backend` compiles a
    step), its allocator events replayed: the fused replay's bytes."""
    from mloc.runtime.compiled.backend import Counts, compile_graph

    gm = make_fx(fn)(*_inputs())
    run = compile_graph(gm, Counts())
    run(*_inputs())                               # compiles
    a, b = _inputs()
    assert allocator_peak(lambda: run(a, b)) == buffer_bytes(gm.graph)[0]


@pytest.mark.parametrize("k", [1, 2, 4, 6, pytest.param(10, marks=pytest.mark.slow), pytest.param(30, marks=pytest.mark.slow)])
def test_the_planners_compiled_solver_vectors_are_the_replay_of_the_solver(k):
    """The planner's closed forms (`mloc.builtins.methods`) of the vectors a compiled cg or
    neumann keeps beyond its eager run equal Inductor's rules replayed over the runtime
    solver's own trace (`solver_vectors`; beside the vectors, a few 0-dim scalars per
    iteration, each a small fraction of a vector: within 0.01 + 0.001·k; measured 0.014 at k = 30)."""
    from mloc.builtins.methods import cg_compiled_vectors, neumann_compiled_vectors
    from mloc.runtime.base.inductor_memory import solver_vectors
    from mloc.runtime.methods.implicit import cg, neumann

    scalars = 0.01 + 0.001 * k
    assert solver_vectors(cg(iters=k)) == pytest.approx(cg_compiled_vectors(k), abs=scalars)
    assert solver_vectors(neumann(iters=k)) == pytest.approx(neumann_compiled_vectors(k), abs=scalars)
