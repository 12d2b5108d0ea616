"""The built-in hypergradient methods: one `Descriptor` each, with the planner's cost.

Costs are in G, one forward+backward of the lower problem's loss, a Hessian-vector product
counting 2 G (Pearlmutter); memory in bytes (`Shape`: d lower parameters, m upper ones,
act activation bytes, b bytes per element), None when the sizes were not measured.

    method          time                 memory
    first_order     G                    activations
    finite_diff     3 G                  activations + d
    sama            3 G                  activations + 2 d
    neumann(K)      2 G + 2 K G          activations + 3 d (one graph kept)
    cg(K)           2 G + 2 K G          activations + 4 d
    itd reverse     4 K G                K (activations + d)      (truncate T: T instead of K)
    itd recompute   8 K G                K d + activations + d
    itd forward     6 K m G              d m + activations        (m: the upper's parameters)

The unrolled-mode constants are calibrated on `bench/plan_memory.py` (a 64-256-10 MLP,
K = 50): one forward-mode direction per step costs about 3 reverse steps' worth of work
(a JVP through a gradient), recompute about twice reverse. `auto` has no cost of its own:
the planner prices the methods it may choose.

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


def _itd(args: dict, s: Shape):
    k = args.get("steps") or 1
    mode = args.get("mode")
    if mode == "forward":
        m = s.m if s.m is not None else 1
        return 6.0 * k * m, _memory(s, lambda d, act, b: d * m * b + act)
    if mode == "recompute":
        return 8.0 * k, _memory(s, lambda d, act, b: k * d * b + act + d * b)
    kept = args.get("truncate") or k
    return 4.0 * k, _memory(s, lambda d, act, b: kept * (act + d * b))


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
