"""Which intermediates a compiled step keeps: the bytes of a graph's buffers as TorchInductor
allocates them, replayed over an FX graph of ATen operations (no compiling).

A captured step is one graph with no autograd left in it (:mod:`.capture`): the backward
passes are operations like the forward's, and a value lives from the operation that
makes it to its last reader, whatever autograd would have saved. TorchInductor
(`torch/_inductor/lowering.py`, `scheduler.py`) lowers each operation either to a loop
body that is *inlined* into the loops of its readers (a pointwise operation: `relu`,
`mul`, `where`, a softmax's elementwise part, ...) or to a *buffer* that is written to
memory: a matrix product or a convolution (an extern kernel, which reads its operands
from memory, so they are buffers too), a reduction's result, a graph output. A pointwise
value is computed again inside each reader instead of being kept (Inductor realizes
one read by many readers only when that is costly: ignored here). Views cost nothing. The
generated code frees each buffer after its last reader (``del buf3``) and reuses its
memory for a later buffer of the same size, which does not change the bytes alive.

:func:`buffer_bytes` replays that over a graph (each node's output shape from its
``meta["val"]``, as ``make_fx`` records it, on the meta device too): the peak of the
bytes alive (placeholders and constants, the step's inputs, not counted), and the bytes
alive just after given operations. Same graph, every value a buffer (``fused=False``):
eager execution with each value freed at its last use, for comparison.

The planner's compiled estimate (`mloc.passes.plan`) evaluates the eager memory model
(`mloc.builtins.methods`) with the lower's graph sizes replayed this way
(`mloc.runtime.grad.introspect.probe_compiled`); `bench/plan_memory.py` measures the
compiled steps' real peaks from the allocator's events (`mloc.runtime.base.allocator`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import fx

# Not tagged pointwise, but lowered by Inductor to pointwise loops around row reductions
# (a softmax's max and sum per row are kept, a batch's rows: negligible) or to constants.
_INLINED = {"_log_softmax", "_softmax", "_log_softmax_backward_data", "_softmax_backward_data",
            "nll_loss_backward", "ones_like", "zeros_like", "full_like", "full", "ones", "zeros",
            "scalar_tensor", "_to_copy", "copy", "fill", "lift_fresh_copy"}


def _kind(node: fx.Node) -> str:
    """``view`` (aliases its input), ``inline`` (pointwise: fused into its readers),
    ``reduce`` (a buffer whose inputs may be inlined), or ``buffer`` (an extern kernel)."""
    op = node.target
    if node.op != "call_function" or type(op).__name__ != "OpOverload":
        return "view" if getattr(op, "__name__", "") == "getitem" else "buffer"
    returns = op._schema.returns
    if returns and returns[0].alias_info is not None:
        return "view"
    if torch.Tag.pointwise in op.tags or op._schema.name.split("::")[-1] in _INLINED:
        return "inline"
    return "reduce" if torch.Tag.reduction in op.tags else "buffer"


def _nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor))


# TorchInductor's rule for writing a pointwise value that could be inlined (torch 2.13,
# `torch/_inductor/graph.py` `run_node`, `ir.py` `StorageBox.should_realize_on_reuse`, CPU
# defaults of `torch/_inductor/config.py`): a value with several readers is written when its
# loop body reads more than 4 buffers (`realize_reads_threshold`) or computes a costly
# function. Its other rule, a body of more than 12 reads (`realize_cpu_acc_reads_threshold`)
# or 50 operations written, is left out: such a value, read by one reader, is fused into that
# reader's kernel by the scheduler and computed there, so its sources live as long as if it
# had been inlined (measured: `tests/compiled/test_buffers.py`'s `long_sum`).
_REUSE_READS = 4
_HEAVY = {"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"}


def _realized(nodes, kinds, owner, readers, outputs, fused: bool) -> tuple[dict, dict]:
    """Which values are written to memory (``kept``) and the kept values, graph inputs
    included, that each value's loop body reads (``sources``). Inlining chains: a sum
    ``x + a p₀ + b p₁ + ...`` built over many operations (an unrolled solver's iterate) is
    inlined into its last reader, which keeps every ``pᵢ`` alive until then; a residual read
    by several operations is written once its body reads more than 4 buffers."""
    kept: dict = {}
    sources: dict[fx.Node, set] = {}
    heavy: dict[fx.Node, bool] = {}
    for n in nodes:
        got: set = set()
        costly = _name(n) in _HEAVY
        for a in n.all_input_nodes:
            if a.op != "call_function":
                got.add(a)                      # a graph input: read from memory
                continue
            base = owner[a]
            if kept.get(base, True):
                got.add(base)
            else:
                got |= sources[base]
                costly = costly or heavy[base]
        sources[n], heavy[n] = got, costly
        if owner[n] is n:
            users = len({u for u in readers.get(n, ())})
            kept[n] = not (fused and kinds[n] == "inline" and n not in outputs
                           and all(kinds[u] in ("inline", "reduce") for u in readers.get(n, ()))
                           and not (users > 1 and (len(got) > _REUSE_READS or costly)))
    return kept, {n: {s for s in got if s.op == "call_function"} for n, got in sources.items()}


def _name(node: fx.Node) -> str:
    op = node.target
    return op._schema.name.split("::")[-1] if type(op).__name__ == "OpOverload" else ""


def buffer_bytes(graph: fx.Graph, marks: Sequence[int] = (), fused: bool = True) -> tuple[int, list[int]]:
    """(peak bytes alive, bytes alive just after each of the ``marks``-th operations) of
    ``graph`` run as the module docstring says (``fused=False``: every value a buffer)."""
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    kinds = {n: _kind(n) for n in nodes}
    owner: dict[fx.Node, fx.Node] = {}          # a view's (or getitem's) base value
    for n in nodes:
        base = next((a for a in n.all_input_nodes if a.op == "call_function"), None)
        owner[n] = owner.get(base, base) if kinds[n] == "view" and base is not None else n
    outputs = {owner.get(a, a) for n in graph.nodes if n.op == "output" for a in n.all_input_nodes}

    readers: dict[fx.Node, list[fx.Node]] = {}      # the operations reading each value, through views
    for v in nodes:
        readers.setdefault(owner[v], []).extend(u for u in v.users if u.op == "call_function" and kinds[u] != "view")
    kept, sources = _realized(nodes, kinds, owner, readers, outputs, fused)
    position = {n: i for i, n in enumerate(nodes)}
    last: dict[fx.Node, int] = {}
    for n in nodes:
        if owner[n] is n and kept[n]:
            for s in sources[n]:
                last[s] = max(last.get(s, -1), position[n])
    end = len(nodes)
    for o in outputs:
        if o in kept:
            for s in ({o} if kept[o] else sources[o]):
                last[s] = end
    live, peak, at, marked = 0, 0, [], set(marks)
    freeing: dict[int, list[fx.Node]] = {}
    for n, i in last.items():
        freeing.setdefault(i, []).append(n)
    for i, n in enumerate(nodes):
        if owner[n] is n and kept[n]:
            live += _nbytes(n)
            peak = max(peak, live)
            if n not in last:                   # read by nothing: freed at once
                live -= _nbytes(n)
        for s in freeing.get(i, ()):
            live -= _nbytes(s)
        if i + 1 in marked:
            at.append(live)
    return peak, at


def _traced(fn) -> tuple[fx.Graph, list[int]]:
    """``fn(mark)`` traced by ``make_fx``; each ``mark()`` call during the trace records how
    many operations the graph had then (the positions :func:`buffer_bytes` takes)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

    marks: list[int] = []

    def mark() -> None:
        marks.append(sum(1 for n in get_proxy_mode().tracer.graph.nodes if n.op == "call_function"))
    return make_fx(lambda: fn(mark))().graph, marks


def compiled_sizes(fn, modules, batch, params: Sequence[torch.Tensor], own: Sequence[torch.Tensor] = (),
                   others: Sequence[torch.Tensor] = ()) -> dict[str, int]:
    """The lower-graph sizes of the memory model (`mloc.builtins.methods`) as a compiled step
    holds them, replayed (:func:`buffer_bytes`) over ``make_fx`` traces of ``fn(*modules,
    batch)`` (meta tensors: nothing computed): ``backward``, the peak of the loss and its
    gradient to ``params`` (every parameter it reaches); ``activations``, alive when the
    forward ends, for a backward to ``others`` (the parameters of the problems it reads
    besides its own, where there are some: in the memory model the activations of a lower's
    loss are those of finite_diff's and SAMA's perturbed losses, differentiated to the upper
    only; a compiled graph keeps only what that backward reads); with ``own`` (the problem's
    own parameters), ``graph``, alive once the gradient to them is taken with what a
    Hessian-vector product through it reads, and ``hvp``, the peak of that product. A key
    whose trace fails is left out (an operation without a meta kernel)."""
    def grads(mark, to, create: bool = False):
        loss = fn(*modules, batch)
        mark()
        return torch.autograd.grad(loss, list(to), create_graph=create, allow_unused=True)

    def hvp(mark):
        g = [t for t in grads(lambda: None, own, True) if t is not None and t.requires_grad]
        mark()
        return torch.autograd.grad(g, list(own), [torch.ones_like(t) for t in g], allow_unused=True)
    out: dict[str, int] = {}
    try:
        graph, marks = _traced(lambda mark: grads(mark, params))
        out["backward"], (out["activations"],) = buffer_bytes(graph, marks)
        if others:
            graph, marks = _traced(lambda mark: grads(mark, others))
            out["activations"] = buffer_bytes(graph, marks)[1][0]
        if own:
            graph, marks = _traced(hvp)
            out["hvp"], (out["graph"],) = buffer_bytes(graph, marks)
    except (RuntimeError, NotImplementedError, TypeError):
        pass
    return out


_PROBE = 4096
"""Elements of the stand-in vector :func:`solver_vectors` traces (the count is per vector:
any size large beside the solver's scalars gives the same)."""


def solver_vectors(solver) -> float:
    """The lower-sized vectors a compiled graph of ``solver.solve(op, v)`` (cg, neumann:
    `mloc.runtime.methods.implicit`) keeps *beyond* the same graph run eagerly, each value
    freed after its last reader. Compiled, the solver's vector updates (``x + α p``,
    ``r − α Hp``, a Neumann sum) are pointwise and inlined into their readers until
    Inductor's realization rules (:func:`_realized`) write them, so the iterations' ``p``
    and ``Hp`` stay alive until then (cg(iters=10): six vectors more than eager). The
    planner prices this by closed forms (`mloc.builtins.methods.cg_compiled_vectors`), which
    tests/compiled/test_buffers.py checks against this replay. The solver's own code is traced
    (``make_fx``, meta tensors) on one vector, the Hessian-vector product a stand-in matrix
    product (an extern kernel: its output and its input are buffers, as a real product's
    are), and both replays of :func:`buffer_bytes` are divided by one vector's bytes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    class Product:
        def hvp(self, p, create_graph=False):
            return [torch.mm(p[0].view(-1, 1), self.w).view(-1)]

    def solve(v, w):
        op = Product()
        op.w = w
        return solver.solve(op, [v])
    graph = make_fx(solve)(torch.empty(_PROBE, device="meta"), torch.empty(1, 1, device="meta")).graph
    return (buffer_bytes(graph)[0] - buffer_bytes(graph, fused=False)[0]) / (4 * _PROBE)
