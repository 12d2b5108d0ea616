"""programs/imaml.mlo's meta-step against iMAML written by hand (Rajeswaran et al. 2019).

The hand-written step, per task of the meta-batch: θ₀ = φ; five SGD steps on the inner
objective task(θ) + (λ/2)‖θ − φ‖² on the task's support set; then the implicit
meta-gradient λ(∇²task(θ₅) + λI)⁻¹ ∇query(θ₅), with the Hessian formed explicitly
(torch.func.hessian) and the system solved by torch.linalg.solve. The mean over the 4 tasks
is the meta-gradient. The program runs in float64 with a small network (97 parameters), CG
run to convergence, and an SGD meta-optimizer with lr 1, so φ₁ − φ₀ is minus mloc's
meta-gradient. 1e-10: CG stops at a relative residual of 1e-14 on a system with condition
number below 1e3 (λ = 2 dominates the curvature of a 97-parameter ReLU net here).
"""

from __future__ import annotations

import importlib.util

import torch
from torch.func import functional_call, grad, hessian

import mloc
from tests.conftest import PROGRAMS

SETS = ["meta.module=tasks.SineNet(hidden=8)", "adapt.module=tasks.SineNet(hidden=8)",
        "meta.optimizer=sgd(lr=1.0)", "meta->adapt.hypergrad=cg(iters=300, tol=1e-14)"]
LAM, LR, STEPS, TASKS = 10.0, 0.01, 5, 4      # programs/imaml.mlo's


def _tasks():
    spec = importlib.util.spec_from_file_location("sinusoid_ref", PROGRAMS / "sinusoid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hand_meta_gradient(net, phi: dict) -> torch.Tensor:
    lib = _tasks()
    names = list(phi)
    flat_phi = torch.cat([phi[n].reshape(-1) for n in names])
    shapes = [phi[n].shape for n in names]

    def unflat(v):
        out, i = {}, 0
        for n, s in zip(names, shapes):
            out[n] = v[i:i + s.numel()].view(s)
            i += s.numel()
        return out

    def mse(v, batch):
        x, y = (t.double() for t in batch)
        return ((functional_call(net, unflat(v), (x,)) - y) ** 2).mean()

    support = lib.sine_tasks(split="support", shots=10, repeat=5).batch
    query = lib.sine_tasks(split="query", shots=10, repeat=1).batch
    total = torch.zeros_like(flat_phi)
    for t in range(TASKS):
        theta = flat_phi.clone()
        for _ in range(STEPS):
            theta = theta - LR * (grad(mse)(theta, support(t)) + LAM * (theta - flat_phi))
        h = hessian(mse)(theta, support(t)) + LAM * torch.eye(theta.numel(), dtype=torch.float64)
        total += LAM * torch.linalg.solve(h, grad(mse)(theta, query(t)))
    return total / TASKS


def test_imaml_meta_step_equals_the_hand_written_one():
    s = mloc.load(PROGRAMS / "imaml.mlo", set=SETS, dtype="float64")
    meta = s.module("meta")
    phi0 = {n: p.detach().clone() for n, p in meta.named_parameters()}
    s.step()
    step = torch.cat([(phi0[n] - p.detach()).reshape(-1) for n, p in meta.named_parameters()])
    want = _hand_meta_gradient(meta, phi0)
    assert step.numel() == 97
    assert torch.allclose(step, want, rtol=0, atol=1e-10), (step - want).abs().max()
