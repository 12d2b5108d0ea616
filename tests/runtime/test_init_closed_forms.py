"""Every executable hypergradient method × {`init`, no `init`} × unroll ∈ {1, 3}, run
through mloc's real pipeline (check, trace, plan, generated train.py, runtime engine),
against closed forms written here in numpy (issue 9, bug 1).

The program (tests/init_programs/quad.py, float64, d = 3): upper φ, lower θ,

    lower  L(θ, φ) = ½(θ − a)ᵀA(θ − a) + (λ/2)‖θ − φ‖²      SGD, lr α = 0.1
    upper  F(θ)    = ½‖θ − b‖²                              SGD, lr β = 0.5

With `init = meta` (`init.mlo`) the lower trains δ and is evaluated at θ = φ + δ; δ = 0 at
the start of each outer step, so θ₀ = φ (iMAML's set-up). Without it (`warm.mlo`) θ
continues from where the previous outer step left it. `maml.mlo` is `init` with the plain
MAML loss ½(θ − a)ᵀA(θ − a), which reads φ only through `init`.

Each outer step n: θ_K = K SGD steps of L(·, φ_n) from θ₀ (φ_n with `init`, the previous
θ_K without); v = ∇F(θ_K) = θ_K − b; H = A + λI; the mixed second derivative of L with
respect to (the lower's trainable parameter, φ) is J = A with `init` (∇_δ L = A(θ − a) + λδ)
and J = −λI without; the direct term is ∂F/∂φ = v with `init` (θ = φ + δ) and 0 without.
The hypergradient is g = direct − Jᵀq, q per method:

    cg(K ≥ d)            q = H⁻¹v                       (with init: iMAML, λ(A+λI)⁻¹v)
    neumann(K, αₙ)       q = αₙ Σ_{j=0}^{K} (I − αₙH)^j v
    finite_diff          q = v                          (central differences are exact
    sama (SGD)           q = α v                         on a quadratic, up to round-off)
    first_order          no indirect term: g = direct  (FO-MAML-K with init)
    itd (K = unroll)     g = Z_Kᵀv, Z₀ = I with init, 0 without, Z_{k+1} = (I − αH)Z_k + αλI
                         (with init and the plain loss: MAML, (I − αA)^K ∇F(θ_K))

and φ_{n+1} = φ_n − βg. Two outer steps are compared: φ₁, φ₂ and the lower's module
(θ_K without init; with init, θ = φ_{n+1} + δ_K, δ_K = θ_K − φ_n for the methods whose
schedule takes the lower steps, and δ = 0 for `itd`, whose unrolled steps are discarded).

Tolerance 1e-10 absolute: every compared entry is below 10 in magnitude, the eigenvalues
of H lie in [2.5, 5.5], and each entry is a few dozen float64 operations (a 3×3 solve, at
most 3 SGD or 4 Neumann steps) away from the closed form, so agreement to a few ulps of 10
(~1e-15) is expected; the finite-difference methods lose a factor ‖∇L‖/(ε‖q‖) ≈ 10 more
(ε = 0.5/‖q‖, and central differences are exact on a quadratic). Measured: ≤ 5.4e-15. The
bug this guards against (a reset before every unrolled step) moves φ and θ by 0.47–3.8.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import mloc
from mloc.api import ProgramError
from mloc.builtins import METHODS

HERE = Path(__file__).resolve().parent.parent / "init_programs"
EDGE = "meta->task"
ALPHA, BETA = 0.1, 0.5                  # the lower's and the upper's SGD learning rates (the .mlo files)
NEUMANN_ITERS, NEUMANN_ALPHA = 4, 0.15
TOL = 1e-10
OUTER_STEPS = 2

# Each executable method with the arguments the closed forms assume. cg runs 2d iterations
# (≥ d = 3, so the Krylov space is all of R^3 and q = H⁻¹v up to round-off).
CALLS = {
    "itd": "itd",
    "cg": "cg(iters=6, tol=1e-14)",
    "neumann": f"neumann(iters={NEUMANN_ITERS}, alpha={NEUMANN_ALPHA})",
    "finite_diff": "finite_diff(eps=0.5)",
    "sama": "sama(eps=0.5)",
    "first_order": "first_order",
}
EXECUTABLE = sorted(n for n, d in METHODS.items() if not d.caps.planned)
UNROLLS = (1, 3)


def _constants() -> dict[str, np.ndarray]:
    spec = importlib.util.spec_from_file_location("init_quad_constants", HERE / "quad.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {k: v.numpy().copy() for k, v in mod.constants().items()}


C = _constants()


def closed_form(method: str, variant: str, unroll: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(φ_n, the lower's module parameters) after each of the first OUTER_STEPS steps."""
    init = variant in ("init", "maml")
    lam = 0.0 if variant == "maml" else float(C["lam"])
    A, a, b = C["A"], C["a"], C["b"]
    eye = np.eye(len(a))
    H = A + lam * eye
    phi, theta = C["phi0"].copy(), C["theta0"].copy()
    out = []
    for _ in range(OUTER_STEPS):
        th = phi.copy() if init else theta.copy()
        Z = eye.copy() if init else np.zeros_like(eye)          # dθ_k/dφ, for itd
        for _ in range(unroll):
            th = th - ALPHA * (A @ (th - a) + lam * (th - phi))
            Z = (eye - ALPHA * H) @ Z + ALPHA * lam * eye
        v = th - b
        direct = v if init else np.zeros_like(v)
        J = A if init else -lam * eye
        if method == "itd":
            g = Z.T @ v
        elif method == "first_order":
            g = direct
        else:
            if method == "cg":
                q = np.linalg.solve(H, v)
            elif method == "neumann":
                term, q = v.copy(), v.copy()
                for _ in range(NEUMANN_ITERS):
                    term = term - NEUMANN_ALPHA * H @ term
                    q = q + term
                q = NEUMANN_ALPHA * q
            elif method == "finite_diff":
                q = v
            elif method == "sama":
                q = ALPHA * v                                   # SGD without momentum: s = η
            else:
                raise AssertionError(f"no closed form written for method {method!r}: add one")
            g = direct - J.T @ q
        new_phi = phi - BETA * g
        if not init:
            lower = th
        elif method == "itd":
            lower = new_phi                                     # δ = 0: the unroll is not committed
        else:
            lower = new_phi + (th - phi)                        # θ_U + δ_K
        out.append((new_phi, lower))
        phi, theta = new_phi, th
    return out


def run_mloc(method: str, variant: str, unroll: int):
    """(φ_n, the lower's module parameters) after each outer step, through `mloc.load`, and
    how many times the engine reset the lower in each outer step (counted on its own calls:
    the generated `outer_step` calls `p.reset`)."""
    program = {"init": "init.mlo", "warm": "warm.mlo", "maml": "maml.mlo"}[variant]
    session = mloc.load(HERE / program, set=[f"{EDGE}.hypergrad={CALLS[method]}", f"{EDGE}.unroll={unroll}"],
                        dtype="float64")
    engine, resets = session.program, []
    reset = engine.reset
    engine.reset = lambda name: (resets.append(name), reset(name))[1]
    out, per_step = [], []
    for _ in range(OUTER_STEPS):
        session.step()
        per_step.append(resets.count("task"))
        resets.clear()
        out.append((session.module("meta").v.detach().numpy().copy(),
                    session.module("task").v.detach().numpy().copy()))
    return out, per_step


def compare(method: str, variant: str, unroll: int):
    """mloc's and the closed form's (φ_n, lower) per step, and the largest |difference|; then
    that an `init` lower was reset exactly once per outer step and a warm one never (issue 9
    printed `repeat 3: reset task; lower_step task`)."""
    (got, resets), want = run_mloc(method, variant, unroll), closed_form(method, variant, unroll)
    err = max(float(np.abs(g - w).max()) for gs, ws in zip(got, want) for g, w in zip(gs, ws))
    return got, want, err, resets


# Methods the checker must reject (E403) when the lower loss reads the upper only through
# `init` (docs/language.md: cg, neumann, finite_diff and sama need "the lower loss reads the
# upper problem (not only init)"): they differentiate ∇_θL with respect to the upper's own
# parameters as the loss reads them, which would give a zero indirect term here. Written
# out rather than read from the descriptors, so a change of the capabilities shows up here.
E403_WITH_INIT_ONLY = {"cg", "neumann", "finite_diff", "sama"}


def _cases():
    for method in EXECUTABLE:
        for variant in ("init", "warm"):
            for unroll in UNROLLS:
                yield pytest.param(method, variant, unroll, id=f"{method}-{variant}-unroll{unroll}")


def _maml_cases():
    for method in EXECUTABLE:
        for unroll in UNROLLS:
            yield pytest.param(method, unroll, id=f"{method}-maml-unroll{unroll}")


def test_every_executable_method_has_a_closed_form_here():
    """A method added to the registry must get its closed form (and CALLS entry) here."""
    assert EXECUTABLE and set(EXECUTABLE) == set(CALLS), (EXECUTABLE, sorted(CALLS))


@pytest.mark.parametrize("method,variant,unroll", list(_cases()))
def test_two_outer_steps_match_the_closed_form(method, variant, unroll):
    got, _, err, resets = compare(method, variant, unroll)
    if method == "first_order" and variant == "warm":
        # Without init, F reads φ through nothing but the dropped indirect term: the
        # hypergradient is identically zero, so φ stays at φ₀ bit for bit, while the lower
        # runs SGD on L(·, φ₀) (closed_form's g = 0 compares that trajectory).
        assert all(np.array_equal(phi, C["phi0"]) for phi, _ in got)
    assert err < TOL, f"{method}-{variant}-unroll{unroll}: max |mloc − closed form| = {err:.3e}"
    assert resets == [0 if variant == "warm" else 1] * OUTER_STEPS, resets


@pytest.mark.parametrize("method,unroll", list(_maml_cases()))
def test_maml_loss_closed_form_or_E403(method, unroll):
    """`init` with a lower loss that reads the upper only through `init`: MAML (itd) and
    FO-MAML (first_order) against (I − αA)^K ∇F(θ_K) and ∇F(θ_K); every other method is
    a located E403, not a silent zero hypergradient."""
    if method in E403_WITH_INIT_ONLY:
        with pytest.raises(ProgramError) as err:
            run_mloc(method, "maml", unroll)
        [diag] = err.value.diagnostics
        assert diag.code == "E403" and diag.span.text == CALLS[method], (diag.code, diag.span.text)
        assert "only through `init`" in diag.message, diag.message
        return
    _, _, err, resets = compare(method, "maml", unroll)
    assert err < TOL, f"{method}-maml-unroll{unroll}: max |mloc − closed form| = {err:.3e}"
    assert resets == [1] * OUTER_STEPS, resets
