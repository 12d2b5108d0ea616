"""programs/imaml.mlo's meta-gradient with a truncated solver (docs/language.md, iMAML).

The program: θ = φ + δ (`init = meta`), inner loss L(φ, δ) = task(θ) + (λ/2)‖θ − φ‖², outer
F = query(θ). With H = ∇²task(θ) + λI (the Hessian of L in δ) and v = ∇query(θ), the
implicit-function hypergradient is

    dF/dφ = ∂F/∂φ − (∂²L/∂φ∂δ)ᵀ q = v − (H − λI) q = λq + (v − Hq),

since ∂F/∂φ = v (θ reads φ) and ∂²L/∂φ∂δ = ∇²task(θ) = H − λI (the proximal term's φ
cancels). With q = H⁻¹v exactly it is λH⁻¹v, the iMAML meta-gradient
(tests/test_imaml.py). With q_K from K steps of CG or a K-term Neumann series it is
λq_K + r_K, r_K = v − Hq_K the solver's residual: what mloc computes. Betty and the iMAML
paper (Rajeswaran et al. 2019, Algorithm 2) take λq_K alone.

Here the hand computation forms H explicitly (torch.func.hessian, float64, a 97-parameter
net), runs K = 3 CG iterations (and a 3-term Neumann series) on it by hand, and compares
`mloc run --steps 1` (SGD meta-optimizer with lr 1: φ₀ − φ₁ is the meta-gradient, averaged
over the 4 tasks) with v − (H − λI)q_K, to 1e-12 (the two sides differ only in the order
of floating-point operations; measured ~1e-15); and checks that λq_K alone is not what it
computes (the residual is far above the tolerance).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.func import functional_call, grad, hessian

import mloc
from mloc.cli import main
from tests.conftest import PROGRAMS
from tests.test_run import params

F64 = torch.float64
LAM, LR, STEPS, TASKS, K = 10.0, 0.01, 5, 4, 3      # programs/imaml.mlo's
SETS = ["meta.module=tasks.SineNet(hidden=8)", "adapt.module=tasks.SineNet(hidden=8)",
        "meta.optimizer=sgd(lr=1.0)"]


def _tasks():
    spec = importlib.util.spec_from_file_location("sinusoid_ref", PROGRAMS / "sinusoid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cg(h: torch.Tensor, v: torch.Tensor, iters: int) -> torch.Tensor:
    """Textbook conjugate gradients on h q = v from q = 0 (Hestenes & Stiefel 1952)."""
    q, r = torch.zeros_like(v), v.clone()
    p = r.clone()
    for _ in range(iters):
        hp = h @ p
        alpha = (r @ r) / (p @ hp)
        q = q + alpha * p
        r_new = r - alpha * hp
        p = r_new + (r_new @ r_new) / (r @ r) * p
        r = r_new
    return q


def neumann(h: torch.Tensor, v: torch.Tensor, iters: int, alpha: float) -> torch.Tensor:
    """α Σ_{j=0}^{K} (I − αh)^j v."""
    term, total = v.clone(), v.clone()
    for _ in range(iters):
        term = term - alpha * (h @ term)
        total = total + term
    return alpha * total


def hand(net, phi: dict, solve) -> tuple[torch.Tensor, torch.Tensor]:
    """(mloc's form v − (H − λI)q_K, Betty's λq_K), each averaged over the tasks."""
    lib = _tasks()
    names = list(phi)
    flat_phi = torch.cat([phi[n].reshape(-1) for n in names])

    def unflat(w):
        out, i = {}, 0
        for n in names:
            out[n] = w[i:i + phi[n].numel()].view(phi[n].shape)
            i += phi[n].numel()
        return out

    def mse(w, batch):
        x, y = (t.double() for t in batch)
        return ((functional_call(net, unflat(w), (x,)) - y) ** 2).mean()

    support = lib.sine_tasks(split="support", shots=10, repeat=5).batch
    query = lib.sine_tasks(split="query", shots=10, repeat=1).batch
    ours, betty = torch.zeros_like(flat_phi), torch.zeros_like(flat_phi)
    eye = torch.eye(flat_phi.numel(), dtype=F64)
    for t in range(TASKS):
        theta = flat_phi.clone()
        for _ in range(STEPS):
            theta = theta - LR * (grad(mse)(theta, support(t)) + LAM * (theta - flat_phi))
        h = hessian(mse)(theta, support(t)) + LAM * eye
        v = grad(mse)(theta, query(t))
        q = solve(h, v)
        ours += v - (h - LAM * eye) @ q
        betty += LAM * q
    return ours / TASKS, betty / TASKS


@pytest.mark.parametrize("method,solve", [
    (f"cg(iters={K})", lambda h, v: cg(h, v, K)),
    (f"neumann(iters={K}, alpha=0.05)", lambda h, v: neumann(h, v, K, 0.05)),
])
def test_truncated_meta_gradient_is_the_implicit_function_formula(method, solve, tmp_path):
    sets = [*SETS, f"meta->adapt.hypergrad={method}"]
    start = mloc.load(PROGRAMS / "imaml.mlo", set=sets, dtype="float64")
    net = start.module("meta")
    phi0 = {n: p.detach().clone() for n, p in net.named_parameters()}
    argv = ["run", str(PROGRAMS / "imaml.mlo"), "--steps", "1", "--dtype", "float64", "--out", str(tmp_path),
            "--quiet", "--device", "cpu"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    after = params(tmp_path)
    phi1 = torch.cat([after[f"meta.{i}"].reshape(-1) for i in range(len(phi0))])
    step = torch.cat([p.reshape(-1) for p in phi0.values()]) - phi1       # lr 1: the meta-gradient
    ours, betty = hand(net, phi0, solve)
    assert step.numel() == 97
    assert torch.allclose(step, ours, rtol=0, atol=1e-12), (step - ours).abs().max()
    assert (step - betty).abs().max() > 1e-6                  # not λq_K: the residual r_K is kept
