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
lower's activations; m upper parameters; K steps, T = truncate or K of them differentiated,
c = ⌈√T⌉, n = ⌈T/c⌉ + c − 1, r = min(m, 32)):

    method          time (G)                    method's phase: what it holds at its peak
    first_order     1                           nothing (the upper's own gradient when its loss reads itself)
    finite_diff     3                           3 D (q, θ ± εq) + 2 A (the two perturbed losses)
    sama            3                           3 D + 2 A (q = s ⊙ v; s made and dropped before)
    neumann(K)      2 + 2 K                     H + 2 D (p, the sum), flat in K
    cg(K)           2 + 2 K                     H + 4 D (x, r, p, Hp), flat in K
    itd reverse     4 T                         (T − 1) G + max(H, upper) + D: T − 1 graphs, the fused backward
    itd recompute   4 T + 2 (2T − ⌈T/c⌉)        n (D + S) + 4 D + max(H, upper): the checkpoints and one
                                                segment's iterates, one graph rebuilt
    itd forward     T (10 + m)                  G + H + 2 m (D + S) + r (0.55 (H − G) + m b), or
                                                G + H + 3 m (D + S) where that is more (m > 32): flat in K

For `itd` the K − T steps before the differentiated ones run without graph (2 G each, in
every mode, and no memory kept). Recompute keeps the ⌈T/c⌉ checkpoints through the sweep and
recomputes one segment's c iterates at a time (the segment starts at its checkpoint: n
distinct iterates). Forward mode carries the m tangents of θ and the state, old and new, with
Φ's graph and the graph of Jᵀu (G + H) and one batched backward's intermediates, r directions
at a time; with more than 32 directions, the batches' results are concatenated at the end of
the step (old tangents, the batches' and the concatenation: 3 m (D + S)). A lone
differentiated step (T = 1) carries no tangents in, and only the directions of x go through
it: m (D + S) and 0.1 (H − G) per direction instead.

Differentiable (a pass below a middle problem under `exact`, `Shape.differentiable`), cg and
neumann keep every Hessian-vector product's graph: G + K (H - G) + the vectors; a middle's
reduced objective runs such a pass inside each of its own products (`Shape.nested`, added
to its H). The constants (the counts of vectors, `_COMMIT`, the `ITD_*` constants) are
measured, not assumed: read off `PeakMemory(detail=True)`'s list of what is alive at each
step's peak and checked by `python3 bench/plan_memory.py` (tests/test_plan_memory.py: every
method and itd mode on the example programs, estimate within 1.5 × of the allocator-level
measurement). The itd lines model `mloc/runtime/methods/unrolled.py` as it runs (the
checkpoint spacing and the batch of directions are `mloc.shared.unroll`'s, which both
read): after a change there, rerun that command and `--itd 10 100`, `--itd 1000`, and
update `itd_time`, `itd_memory` and their constants. The time constants are calibrated with
`bench/itd_modes.py` (hpo.mlo).
`auto` has no cost of its own: the planner prices the methods it may choose.

The names methods go by in papers (`darts`, `maml`, `imaml`, ...) are each descriptor's
`aliases`: an unknown method that is one is answered with the method's call.

Adding a method: its descriptor here, its factory in `mloc/runtime/methods/` (named by
`runtime`), its row in `docs/language.md`; its memory is checked against a measurement by
tests/test_plan_memory.py as soon as it is in the registry.
"""

from __future__ import annotations

from mloc.builtins.descriptor import Alias, AutoRank, Descriptor, MethodCaps, Param, Shape, SyncCaps, signature
from mloc.builtins.registry import Registry
from mloc.lang.types import Enum, Float
from mloc.lang.vocabulary import ITD_MODES, REPEATS
from mloc.shared.unroll import DIRECTIONS_PER_BATCH, checkpoints, segment_length

POSITIVE = Float(0, open_lo=True)

# --- calibration: counts of lower-sized vectors each method holds beside its graphs, read off
# the measured peaks (`python3 bench/plan_memory.py`; tests/test_plan_memory.py checks them) ---
_FD_VECTORS = 3             # finite_diff, sama: q, θ + εq, θ − εq
_FD_FORWARDS = 2            # ... and the two perturbed losses' activations
_NEUMANN_VECTORS = 2        # p and the running sum, beside one Hessian-vector product
_CG_VECTORS = 4             # x, r, p, Hp
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


def cg_compiled_vectors(k: int) -> int:
    """The lower-sized vectors a compiled graph of ``cg(iters=k)`` keeps beyond its eager
    run: the solution ``x = Σ αᵢ pᵢ`` is pointwise, inlined into its last reader, so every
    direction ``pᵢ`` lives to the end (k of them, where eager holds x, r, p, Hp); below 4
    iterations inlining saves more than it keeps. Read off Inductor's rules replayed over the
    solver's own trace (`mloc.runtime.base.inductor_memory.solver_vectors`, which
    tests/compiled/test_buffers.py compares with this); imaml.mlo's cg(iters=10) was
    estimated at 0.62 × its measured compiled peak without it."""
    return max(k - 4, -2)


def neumann_compiled_vectors(k: int) -> int:
    """As :func:`cg_compiled_vectors`, for ``neumann(iters=k)``: the series' sum is inlined,
    each term ``(I − αH)ʲv`` kept to the end (k − 3 beyond eager's p and the sum)."""
    return k - 3 if k >= 2 else 0


def _implicit(vectors: int, compiled_vectors):
    """cg and neumann: 2 G for the mixed product, 2 G per Hessian-vector product; compiled,
    the vectors the solver's inlined sum keeps beside (``compiled_vectors(iters)``)."""
    def cost(args: dict, s: Shape):
        k = args.get("iters") or 1
        if not s.known:
            return 2.0 + 2.0 * k, None
        held = (vectors + (compiled_vectors(k) if s.compiled else 0)) * s.d * s.b
        if s.differentiable:                  # every product's graph is kept for the pass above
            return 2.0 + 2.0 * k, _step(s, _graph(s) + k * (_hvp(s) - _graph(s)) + held)
        return 2.0 + 2.0 * k, _step(s, _hvp(s) + held)
    return cost


# --- itd: each mode's cost, in one place (the constants are what a calibration changes) -----

# time, in G
ITD_STEP_G = 4.0        # reverse: one step with its graph (forward, backward with graph, update) and its sweep step
ITD_UNROLL_G = 2.0      # one step without graph (forward, backward, update): the truncated prefix, recompute's unrolls
ITD_JVP_G = 10.0        # forward: Φ with its graph, Jᵀu with its graph, one batched backward
ITD_DIRECTION_G = 1.0   # forward: the arithmetic one more tangent direction adds to the batched backward
# memory, read off measured peaks (`python3 bench/plan_memory.py`; tests/test_plan_memory.py)
ITD_REVERSE_VECTORS = 1     # reverse: the adjoint of θ the backward carries through the steps
ITD_RECOMPUTE_VECTORS = 4   # recompute: the sweep's adjoints of θ and of the state, old and new
ITD_DIRECTION_HVP = 0.55    # forward: the batched backward's intermediates per direction, in a
                            # Hessian-vector product's own temporaries (H − G): 0.55-0.56 on hpo.mlo
                            # (m = 30) and data_reweighting (m = 7, 31)
ITD_FIRST_DIRECTION_HVP = 0.1   # ...in the first step, where only x's directions go through (T = 1)


def itd_time(mode: str, k: int, kept: int, m: int) -> float:
    """G per hypergradient: ``k`` steps, the last ``kept`` (T) differentiated, ``m`` upper
    parameters. Recompute adds to reverse's work the graph-free unroll that stores the
    checkpoints (T steps) and the segments' recomputation (T − ⌈T/c⌉ steps); forward pushes
    the m tangents through every step (the runtime's docstring derives each term)."""
    prefix = ITD_UNROLL_G * (k - kept)
    if mode == "forward":
        return prefix + kept * (ITD_JVP_G + ITD_DIRECTION_G * m)
    reverse = prefix + ITD_STEP_G * kept
    if mode == "recompute":
        return reverse + ITD_UNROLL_G * (2 * kept - checkpoints(kept))
    return reverse


def itd_memory(mode: str, kept: int, m: int, s: Shape) -> int | None:
    """Bytes of the upper's hypergradient step (`_step`) through ``kept`` (T) differentiated
    steps (the module docstring's table): reverse keeps T − 1 step graphs beside the fused
    backward's peak; recompute ``n = ⌈T/c⌉ + c − 1`` iterates (the checkpoints and one
    segment's, `mloc.shared.unroll`) and one rebuilt step; forward the tangents, old and
    new, two graphs and a batch of directions' intermediates, flat in T."""
    if not s.known:
        return None
    d, st = s.d * s.b, s.state * s.d * s.b
    if mode == "forward":
        batch, tangents = min(m, DIRECTIONS_PER_BATCH), m * (d + st)
        # from the second step on, the tangents carried in beside those pushed out; the first
        # step's start at 0: only the directions e_j of x go through it, with fewer intermediates
        old, per_direction = (tangents, ITD_DIRECTION_HVP) if kept > 1 else (0, ITD_FIRST_DIRECTION_HVP)
        pushing = old + tangents + batch * (per_direction * (_hvp(s) - _graph(s)) + m * s.b)
        joined = old + 2 * tangents if m > DIRECTIONS_PER_BATCH else 0    # the batches' results, concatenated
        return _step(s, _graph(s) + _hvp(s) + max(pushing, joined))
    reverse = _step(s, (kept - 1) * _graph(s) + max(_hvp(s), s.upper or 0) + ITD_REVERSE_VECTORS * d)
    if mode == "recompute":
        iterates = checkpoints(kept) + segment_length(kept) - 1
        rebuilt = _step(s, iterates * (d + st) + ITD_RECOMPUTE_VECTORS * d + max(_hvp(s), s.upper or 0))
        # compiled, a checkpoint is a copy of a value the graph holds anyway (a clone, inlined
        # into its readers) and each buffer is freed after its last reader: never more than the
        # same unroll compiled in reverse mode (measured at T = 2: 628 KiB against reverse's 695)
        return min(rebuilt, reverse) if s.compiled and rebuilt is not None else rebuilt
    return reverse


def _itd(args: dict, s: Shape):
    k = args.get("steps") or 1
    kept = args.get("truncate") or k
    mode = args.get("mode") or "reverse"
    m = s.m if s.m is not None else 1
    return itd_time(mode, k, kept, m), itd_memory(mode, kept, m, s)


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
    MethodCaps(implicit=True, differentiable=True, task_vmap=True, sync=SyncCaps(hvps="iters"),
               auto=AutoRank(0, "the most accurate implicit method (10 CG steps) fits the budget")),
    "mloc.runtime.methods:cg", _implicit(_CG_VECTORS, cg_compiled_vectors),
    (Alias("imaml", "cg", "iMAML's implicit hypergradient by conjugate gradients (Rajeswaran et al., 2019)"),
     Alias("hoag", "cg", "HOAG's implicit hypergradient by conjugate gradients (Pedregosa, 2016)")))

NEUMANN = Descriptor(
    signature("neumann", "implicit differentiation, H⁻¹v by a truncated Neumann series",
              Param("iters", REPEATS, 5), Param("alpha", POSITIVE, 0.1)),
    MethodCaps(implicit=True, differentiable=True, task_vmap=True, sync=SyncCaps(hvps="iters")),
    "mloc.runtime.methods:neumann", _implicit(_NEUMANN_VECTORS, neumann_compiled_vectors))

FINITE_DIFF = Descriptor(
    signature("finite_diff", "identity Hessian, mixed product by central differences (DARTS)",
              Param("eps", POSITIVE, 0.01),
              Param("xi", POSITIVE, 1.0, doc="the unrolled step's size ξ in DARTS' eq. 7: "
                    "the BR-VJP is −ξ J_xᵀ v (1: Betty's darts; the weights' lr: the paper's)")),
    MethodCaps(two_level=True, shards=True,
               auto=AutoRank(2, "second-order methods exceed the budget; finite differences")),
    "mloc.runtime.methods:finite_diff", _finite_difference,
    (Alias("darts", "finite_diff", "DARTS's second-order approximation (Liu et al., 2019)"),))

SAMA = Descriptor(
    signature("sama", "SAMA: finite differences on the optimizer-adjusted direction",
              Param("eps", POSITIVE, 0.01)),
    MethodCaps(needs=frozenset({"sama_diag"}), two_level=True, sync=SyncCaps(lower_grad=True), shards=True,
               auto=AutoRank(1, "CG's Hessian-vector graphs exceed the budget; SAMA needs no second order")),
    "mloc.runtime.methods:sama", _finite_difference)

FIRST_ORDER = Descriptor(
    signature("first_order", "drop the indirect term (first-order MAML)"),
    MethodCaps(reads_init=True, differentiable=True, no_indirect=True, task_vmap=True, shards=True),
    "mloc.runtime.methods:first_order", _first_order,
    (Alias("fomaml", "first_order", "first-order MAML (Finn et al., 2017)"),))

AUTO = Descriptor(
    signature("auto", "let the planner choose a method under the memory budget"),
    MethodCaps(planned=True),
    None)

METHODS: Registry = Registry(MethodCaps, ITD, CG, NEUMANN, FINITE_DIFF, SAMA, FIRST_ORDER, AUTO)
