"""The built-in hypergradient methods: one `Descriptor` each, with the planner's cost.

Costs are in G, one forward+backward of the lower problem's loss, a Hessian-vector product
counting 2 G (Pearlmutter); memory in bytes of one whole hypergradient step of the upper
(`Shape`, every size measured by the compiler on the meta device; None when not measured).

Memory model. A step draws the upper's batch (`batch`, held throughout), then runs phases
one after another, each freeing what it made before the next: the upper's loss forward and
backward to its adjoint v (`upper`), the method's BR-VJP, the upper's optimizer commit. Its
peak is the batch plus the largest phase. The method's phase, in what it holds (D = d·b
bytes of one lower-sized vector, S = state·d·b of the lower optimizer's state, G the graph
of the lower's gradient, H the peak of one Hessian-vector product through it, A the
lower's activations; K steps, T kept by `truncate`):

    method          time                 method's phase: what it holds at its peak
    first_order     G                    nothing (the upper's own gradient when its loss reads itself)
    finite_diff     3 G                  3 D (q, θ ± εq) + 2 A (the two perturbed losses)
    sama            3 G                  3 D + 2 A (q = s ⊙ v; s made and dropped before)
    neumann(K)      2 G + 2 K G          H + 2 D (p, the sum), flat in K
    cg(K)           2 G + 2 K G          H + 4 D (x, r, p, Hp), flat in K
    itd reverse     4 K G                (T - 1) G + max(H, upper) + D: T - 1 graphs, the fused backward
    itd recompute   8 K G                K (D + S) + 4 D + max(H, upper): the iterates, one graph rebuilt
    itd forward     6 K m G              m (2 (D + S) + D) + H + m² b: the tangents, old and new, flat in K

Differentiable (a pass below a middle problem under `exact`, `Shape.differentiable`), cg and
neumann keep every Hessian-vector product's graph: G + K (H - G) + the vectors; a middle's
reduced objective runs such a pass inside each of its own products (`Shape.nested`, added
to its H). The constants (the counts of vectors, `_COMMIT`) are measured, not assumed: read
off `PeakMemory(detail=True)`'s list of what is alive at each step's peak and checked by
`python3 bench/plan_memory.py` (tests/test_plan_memory.py: every method and itd mode on the
example programs, estimate within 1.5 × of the allocator-level measurement). The forward and
recompute lines model the current `mloc/runtime/methods/unrolled.py`: after a change there,
rerun that command and update `_FORWARD_VECTORS`, `_RECOMPUTE_VECTORS` and the two lines.
Time constants: one forward-mode direction per step costs about 3 reverse steps' worth of
work (a JVP through a gradient), recompute about twice reverse (`bench/plan_memory.py --itd`).
`auto` has no cost of its own: the planner prices the methods it may choose.

The names methods go by in papers (`darts`, `maml`, `imaml`, ...) are each descriptor's
`aliases`: an unknown method that is one is answered with the method's call.

Adding a method: its descriptor here, its factory in `mloc/runtime/methods/` (named by
`runtime`), its row in `docs/language.md`; its memory is checked against a measurement by
tests/test_plan_memory.py as soon as it is in the registry.
"""

from __future__ import annotations

from mloc.builtins.descriptor import Alias, AutoRank, Descriptor, MethodCaps, Param, Shape, signature
from mloc.builtins.registry import Registry
from mloc.lang.types import Enum, Float
from mloc.lang.vocabulary import ITD_MODES, REPEATS

POSITIVE = Float(0, open_lo=True)

# --- calibration: counts of lower-sized vectors each method holds beside its graphs, read off
# the measured peaks (`python3 bench/plan_memory.py`; tests/test_plan_memory.py checks them) ---
_FD_VECTORS = 3             # finite_diff, sama: q, θ + εq, θ − εq
_FD_FORWARDS = 2            # ... and the two perturbed losses' activations
_NEUMANN_VECTORS = 2        # p and the running sum, beside one Hessian-vector product
_CG_VECTORS = 4             # x, r, p, Hp
_REVERSE_VECTORS = 1        # the adjoint of θ the backward carries through the steps
_RECOMPUTE_VECTORS = 4      # the sweep's adjoints of θ and of the state, old and new
_FORWARD_VECTORS = 1        # per direction, beside its old and new tangents (θ and state): the
                            # gradient's tangent
_COMMIT = 3                 # the upper's commit: its gradient and its optimizer's temporaries, × m b
# Where the meta device could not differentiate the lower's loss twice (an operation without
# a meta kernel for its double backward), the graph and a product through it are estimated
# from its activations: G ≈ A + D (the forward's tensors and g), H ≈ G + 3 A + D (the
# backward of the backward recomputes about three activation-sized tensors per saved one;
# H − G measured 2.4–8.2 A on the examples).
_HVP_PER_ACT = 3


def _graph(s: Shape) -> int:
    return s.graph if s.graph is not None else s.act + s.d * s.b


def _hvp(s: Shape) -> int:
    h = s.hvp if s.hvp is not None else _graph(s) + _HVP_PER_ACT * s.act + s.d * s.b
    return h + s.nested


def _step(s: Shape, method: int) -> int | None:
    """The step's peak: the upper's batch and the largest of its phases (module docstring);
    for a differentiable pass inside another step (`Shape.differentiable`), the method's
    phase alone."""
    if not s.known:
        return None
    if s.differentiable:
        return int(method)
    return int(s.batch + max(s.upper or 0, method, _COMMIT * (s.m or 0) * s.b))


def _first_order(args: dict, s: Shape):
    return 1.0, _step(s, 0)


def _finite_difference(args: dict, s: Shape):
    if not s.known:
        return 3.0, None
    return 3.0, _step(s, _FD_VECTORS * s.d * s.b + _FD_FORWARDS * s.act)


def _implicit(vectors: int):
    """cg and neumann: 2 G for the mixed product, 2 G per Hessian-vector product."""
    def cost(args: dict, s: Shape):
        k = args.get("iters") or 1
        if not s.known:
            return 2.0 + 2.0 * k, None
        held = vectors * s.d * s.b
        if s.differentiable:                  # every product's graph is kept for the pass above
            return 2.0 + 2.0 * k, _step(s, _graph(s) + k * (_hvp(s) - _graph(s)) + held)
        return 2.0 + 2.0 * k, _step(s, _hvp(s) + held)
    return cost


def _itd(args: dict, s: Shape):
    k = args.get("steps") or 1
    mode = args.get("mode")
    if mode == "forward":
        m = s.m if s.m is not None else 1
        time = 6.0 * k * m
    elif mode == "recompute":
        time = 8.0 * k
    else:
        time = 4.0 * k
    if not s.known:
        return time, None
    d, st = s.d * s.b, s.state * s.d * s.b
    if mode == "forward":
        tangents = (2 * (d + st) + _FORWARD_VECTORS * d) * m
        return time, _step(s, tangents + _hvp(s) + m * m * s.b)
    if mode == "recompute":
        return time, _step(s, k * (d + st) + _RECOMPUTE_VECTORS * d + max(_hvp(s), s.upper or 0))
    kept = args.get("truncate") or k
    return time, _step(s, (kept - 1) * _graph(s) + max(_hvp(s), s.upper or 0) + _REVERSE_VECTORS * d)


ITD = Descriptor(
    signature("itd", "iterative differentiation: backpropagate through the unrolled lower steps",
              Param("steps", REPEATS, None, doc="steps differentiated (default: the edge's unroll)"),
              Param("truncate", REPEATS, None, doc="differentiate only the last T steps"),
              Param("mode", Enum(ITD_MODES), "auto")),
    MethodCaps(unrolls=True, reads_init=True, needs=frozenset({"differentiable"}),
               fusable=True),
    "mloc.runtime.methods:itd", _itd,
    (Alias("maml", "itd", "MAML's hypergradient, through the unrolled inner steps (Finn et al., 2017)"),
     Alias("rhg", "itd(mode=reverse)", "the reverse-mode hypergradient, RHG (Franceschi et al., 2017)"),
     Alias("fhg", "itd(mode=forward)", "the forward-mode hypergradient, FHG (Franceschi et al., 2017)"),
     Alias("mwn", "itd(steps=1)", "Meta-Weight-Net's hypergradient, through one look-ahead step (Shu et al., 2019)")))

CG = Descriptor(
    signature("cg", "implicit differentiation, H⁻¹v by conjugate gradients",
              Param("iters", REPEATS, 10), Param("tol", Float(0), 1e-10)),
    MethodCaps(implicit=True, differentiable=True, task_vmap=True,
               auto=AutoRank(0, "the most accurate implicit method (10 CG steps) fits the budget")),
    "mloc.runtime.methods:cg", _implicit(_CG_VECTORS),
    (Alias("imaml", "cg", "iMAML's implicit hypergradient by conjugate gradients (Rajeswaran et al., 2019)"),
     Alias("hoag", "cg", "HOAG's implicit hypergradient by conjugate gradients (Pedregosa, 2016)")))

NEUMANN = Descriptor(
    signature("neumann", "implicit differentiation, H⁻¹v by a truncated Neumann series",
              Param("iters", REPEATS, 5), Param("alpha", POSITIVE, 0.1)),
    MethodCaps(implicit=True, differentiable=True, task_vmap=True),
    "mloc.runtime.methods:neumann", _implicit(_NEUMANN_VECTORS))

FINITE_DIFF = Descriptor(
    signature("finite_diff", "identity Hessian, mixed product by central differences (DARTS)",
              Param("eps", POSITIVE, 0.01)),
    MethodCaps(two_level=True,
               auto=AutoRank(2, "second-order methods exceed the budget; finite differences")),
    "mloc.runtime.methods:finite_diff", _finite_difference,
    (Alias("darts", "finite_diff", "DARTS's second-order approximation (Liu et al., 2019)"),))

SAMA = Descriptor(
    signature("sama", "SAMA: finite differences on the optimizer-adjusted direction",
              Param("eps", POSITIVE, 0.01)),
    MethodCaps(needs=frozenset({"sama_diag"}), two_level=True,
               auto=AutoRank(1, "CG's Hessian-vector graphs exceed the budget; SAMA needs no second order")),
    "mloc.runtime.methods:sama", _finite_difference)

FIRST_ORDER = Descriptor(
    signature("first_order", "drop the indirect term (first-order MAML)"),
    MethodCaps(reads_init=True, differentiable=True, no_indirect=True, task_vmap=True),
    "mloc.runtime.methods:first_order", _first_order,
    (Alias("fomaml", "first_order", "first-order MAML (Finn et al., 2017)"),))

AUTO = Descriptor(
    signature("auto", "let the planner choose a method under the memory budget"),
    MethodCaps(planned=True),
    None)

METHODS: Registry = Registry(MethodCaps, ITD, CG, NEUMANN, FINITE_DIFF, SAMA, FIRST_ORDER, AUTO)
