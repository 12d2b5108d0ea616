"""programs/sinusoid.py's `adapted_error`, the evaluation of maml.mlo and imaml.mlo: the mean
over held-out tasks of the query MSE after `steps` SGD steps from the meta-weights φ on the
task's support set, minimising mse (+ (λ/2)‖θ − φ‖² when λ > 0). Checked against the same
steps written with `torch.func.functional_call`, under `torch.no_grad()`, leaving the module,
its gradients and the global RNG as they were."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.func import functional_call

from tests.conftest import PROGRAMS


def _tasks():
    spec = importlib.util.spec_from_file_location("sinusoid_eval_ref", PROGRAMS / "sinusoid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _by_hand(net, support, query, steps: int, lr: float, lam: float, n_tasks: int) -> float:
    """θ ← θ − lr·∇[mse(θ; s_t) + (λ/2)‖θ − φ‖²], `steps` times; the mean of mse(θ; q_t)."""
    names = [n for n, _ in net.named_parameters()]
    phi = [p.detach().clone() for p in net.parameters()]

    def mse(params, batch):
        x, y = batch
        return (functional_call(net, dict(zip(names, params)), (x,)) - y).pow(2).mean()

    errors = []
    for t in range(n_tasks):
        theta = [p.clone().requires_grad_() for p in phi]
        for _ in range(steps):
            loss = mse(theta, support.batch(t)) + 0.5 * lam * sum((a - b).pow(2).sum() for a, b in zip(theta, phi))
            grads = torch.autograd.grad(loss, theta)
            theta = [(a - lr * g).detach().requires_grad_() for a, g in zip(theta, grads)]
        errors.append(mse(theta, query.batch(t)).item())
    return sum(errors) / n_tasks


@pytest.mark.parametrize("lam", [0.0, 10.0], ids=["maml", "imaml"])
def test_adapted_error_is_the_query_mse_after_the_inner_steps(lam):
    tasks = _tasks()
    torch.manual_seed(0)
    net = tasks.SineNet(hidden=8)
    net(torch.zeros(1, 1)).sum().backward()                       # a .grad the evaluation must keep
    state = {k: v.clone() for k, v in net.state_dict().items()}
    grads = [p.grad.clone() for p in net.parameters()]
    support, query = tasks.sine_tasks("support", seed=99), tasks.sine_tasks("query", seed=99)
    rng = torch.get_rng_state()
    with torch.no_grad():
        got = tasks.adapted_error(net, support, query, steps=5, lr=0.01, lam=lam, n_tasks=4)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, net.parameters()))
    assert got == pytest.approx(_by_hand(net, support, query, 5, 0.01, lam, 4), rel=1e-5)
    assert got < tasks.zero_shot_error(net, query, n_tasks=4)       # the steps do adapt
