"""The built-in hypergradient methods: one `Descriptor` each, with the planner's cost.

Costs are in G, one forward+backward of the lower problem's loss, a Hessian-vector product
counting 2 G (Pearlmutter); memory in bytes (`Shape`: d lower parameters, m upper ones,
act activation bytes, b bytes per element), None when the sizes were not measured.

    method          time                         memory
    first_order     G                            activations
    finite_diff     3 G                          activations + d
    sama            3 G                          activations + 2 d
    neumann(K)      2 G + 2 K G                  activations + 3 d (one graph kept)
    cg(K)           2 G + 2 K G                  activations + 4 d
    itd reverse     4 T G                        T (activations + d)
    itd recompute   4 T G + 2 (2T − ⌈T/c⌉) G     (⌈T/c⌉ + c) d + activations + d,  c = ⌈√T⌉
    itd forward     T (10 + m) G                 d m + 2 (activations + d) + min(m, 32) (6 d + activations/20)

For `itd`, T = truncate or K steps are differentiated; the K − T steps before them run
without graph (2 G each, in every mode). The unrolled modes' formulas and constants live in
one place, `itd_time` and `itd_memory` below, with what each term counts; the constants are
calibrated with `bench/itd_modes.py` (hpo.mlo) and `bench/plan_memory.py` (a 64-256-10 MLP).
`auto` has no cost of its own: the planner prices the methods it may choose.

The names methods go by in papers (`darts`, `maml`, `imaml`, ...) are each descriptor's
`aliases`: an unknown method that is one is answered with the method's call.

Adding a method: its descriptor here, its factory in `mloc/runtime/methods/` (named by
`runtime`), its row in `docs/language.md`.
"""

from __future__ import annotations

from mloc.builtins.descriptor import Alias, AutoRank, Descriptor, MethodCaps, Param, Shape, signature
from mloc.builtins.registry import Registry
from mloc.lang.types import Enum, Float
from mloc.lang.vocabulary import ITD_MODES, REPEATS
from mloc.shared.unroll import DIRECTIONS_PER_BATCH, checkpoints, segment_length

POSITIVE = Float(0, open_lo=True)


def _memory(shape: Shape, formula) -> int | None:
    return int(formula(shape.d, shape.act, shape.b)) if shape.known else None


def _first_order(args: dict, s: Shape):
    return 1.0, _memory(s, lambda d, act, b: act)


def _finite_diff(args: dict, s: Shape):
    return 3.0, _memory(s, lambda d, act, b: act + d * b)


def _sama(args: dict, s: Shape):
    return 3.0, _memory(s, lambda d, act, b: act + 2 * d * b)


def _implicit(kept_vectors: int):
    """cg and neumann: 2 G for the mixed product, 2 G per Hessian-vector product."""
    def cost(args: dict, s: Shape):
        k = args.get("iters") or 1
        return 2.0 + 2.0 * k, _memory(s, lambda d, act, b: act + kept_vectors * d * b)
    return cost


# --- itd: each mode's cost, in one place (the constants are what a calibration changes) -----

ITD_STEP_G = 4.0        # reverse: one step with its graph (forward, backward with graph, update) and its sweep step
ITD_UNROLL_G = 2.0      # one step without graph (forward, backward, update): the truncated prefix, recompute's unrolls
ITD_JVP_G = 10.0        # forward: Φ with its graph, Jᵀu with its graph, one batched backward
ITD_DIRECTION_G = 1.0   # forward: the arithmetic one more tangent direction adds to the batched backward
ITD_JVP_PARAMS = 6.0    # forward: the batched backward's intermediates per direction, in parameter copies (d)...
ITD_JVP_ACT = 0.05      # ...and in activations (fitted: hpo.mlo, m = 30; the bench MLP, m = 2, 16, 64)


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


def itd_memory(mode: str, kept: int, m: int, d: int, act: int, b: int) -> int:
    """Bytes held at the peak, beside the parameters: reverse keeps T step graphs; recompute
    ⌈T/c⌉ checkpoints, one segment's c iterates and one step's graph; forward the d×m
    tangents, one step's graph and its VJP's, and a batch of directions' intermediates.
    The optimizer state's share (its iterates, its tangents) is not counted, as everywhere
    in this table: the planner reports the state apart (`state_memory`)."""
    if mode == "forward":
        batch = min(m, DIRECTIONS_PER_BATCH)
        return int(d * m * b + 2 * (act + d * b) + batch * (ITD_JVP_PARAMS * d * b + ITD_JVP_ACT * act))
    if mode == "recompute":
        return int((checkpoints(kept) + segment_length(kept)) * d * b + act + d * b)
    return int(kept * (act + d * b))


def _itd(args: dict, s: Shape):
    k = args.get("steps") or 1
    kept = args.get("truncate") or k
    mode = args.get("mode") or "reverse"
    m = s.m if s.m is not None else 1
    memory = itd_memory(mode, kept, m, s.d, s.act, s.b) if s.known else None
    return itd_time(mode, k, kept, m), memory


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
    "mloc.runtime.methods:cg", _implicit(4),
    (Alias("imaml", "cg", "iMAML's implicit hypergradient by conjugate gradients (Rajeswaran et al., 2019)"),
     Alias("hoag", "cg", "HOAG's implicit hypergradient by conjugate gradients (Pedregosa, 2016)")))

NEUMANN = Descriptor(
    signature("neumann", "implicit differentiation, H⁻¹v by a truncated Neumann series",
              Param("iters", REPEATS, 5), Param("alpha", POSITIVE, 0.1)),
    MethodCaps(implicit=True, differentiable=True, task_vmap=True),
    "mloc.runtime.methods:neumann", _implicit(3))

FINITE_DIFF = Descriptor(
    signature("finite_diff", "identity Hessian, mixed product by central differences (DARTS)",
              Param("eps", POSITIVE, 0.01)),
    MethodCaps(two_level=True,
               auto=AutoRank(2, "second-order methods exceed the budget; finite differences")),
    "mloc.runtime.methods:finite_diff", _finite_diff,
    (Alias("darts", "finite_diff", "DARTS's second-order approximation (Liu et al., 2019)"),))

SAMA = Descriptor(
    signature("sama", "SAMA: finite differences on the optimizer-adjusted direction",
              Param("eps", POSITIVE, 0.01)),
    MethodCaps(needs=frozenset({"sama_diag"}), two_level=True,
               auto=AutoRank(1, "CG's Hessian-vector graphs exceed the budget; SAMA needs no second order")),
    "mloc.runtime.methods:sama", _sama)

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
