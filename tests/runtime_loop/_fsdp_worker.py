"""One rank of the FSDP2 equality test (run by test_fsdp.py with torchrun's variables).

A two-level reweighting program: a classifier θ (6-16-3 MLP, the lower) trained on a loss
whose per-example weights come from a weight net x (1-8-1 MLP, the upper) of each example's
loss; the upper's loss is the classifier's loss on validation data plus ``1e-3`` times the mean square of the
weight net's outputs on it (a direct term through the weight net's forward, so
``first_order`` moves x too: a sharded module's parameters are read through its forward). Each outer step: one plain lower step, one
upper step with the method. Both modules sharded (:mod:`mloc.runtime.base.fsdp`), batch B
per rank; the reference, computed on every rank in-process, is mloc's one-process path on
batch 2B (``torch.autograd.grad`` on the whole modules and :meth:`two_level` of ``finite_diff``/``sama``, the
methods' own code). Prints one JSON line: the largest relative difference per method, and
whether a resume from a gathered state equals the uninterrupted run bitwise. One case
checkpoints the modules' children's activations (:mod:`mloc.runtime.base.recompute`)
under the shards.
"""

from __future__ import annotations

import io
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from mloc.builtins import METHODS
from mloc.runtime import methods, optim
from mloc.runtime.base import fsdp
from mloc.runtime.base.recompute import recompute_children
from mloc.runtime.grad.problem import Problem
from mloc.runtime.methods.finite import finite_diff, sama
from mloc.runtime.processes.ending import end_rank

B, STEPS, DECAY = 8, 4, 1e-3


def modules():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    weights = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
    return net, weights


def data(world):
    g = torch.Generator().manual_seed(1)
    n = STEPS * 2 * B * world
    return [(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for _ in range(2)]


def lower_loss(net, weights, batch):
    x, y = batch
    each = F.cross_entropy(net(x), y, reduction="none")
    return (torch.sigmoid(weights(each.detach()[:, None])).squeeze(-1) * each).mean()


def upper_loss(net, weights, batch):
    x, y = batch
    return F.cross_entropy(net(x), y) + DECAY * weights(x[:, :1]).pow(2).mean()


def batch_at(stream, step, lo, hi, world):
    """Rows ``lo:hi`` of step ``step``'s global batch (``B × world`` rows)."""
    x, y = stream
    start = step * B * world
    return x[start + lo:start + hi], y[start + lo:start + hi]


def make_optimizers(kind):
    if kind == "adam":
        return optim.adam(0.01), optim.adam(0.01)
    return optim.sgd(0.1, momentum=0.9), optim.sgd(0.05)


def run_sharded(name, kind, rank, world, streams, steps, resume_at=None, recompute=False):
    net, weights = modules()
    if recompute:       # activation checkpointing under the shards (children wrapped first)
        recompute_children(net), recompute_children(weights)
    fsdp.shard(net), fsdp.shard(weights)
    lo_opt, up_opt = make_optimizers(kind)
    sl = slice(rank * B, (rank + 1) * B)
    cur = {"step": 0}

    def at(s):
        return batch_at(s, cur["step"], sl.start, sl.stop, world)
    lower = fsdp.Sharded("lower", net, lo_opt, lambda: lower_loss(net, weights, at(streams[0])))
    upper = fsdp.Sharded("upper", weights, up_opt, lambda: upper_loss(net, weights, at(streams[1])))
    both, saved = (lower, upper), None
    method = None if name == "plain" else getattr(methods, name)()
    for step in range(steps):
        if step == resume_at:
            saved = _save([lower, upper])
        cur["step"] = step
        fsdp.plain_step(lower, both)
        if method is not None:
            upper.commit(fsdp.hypergradient(method, METHODS[name].caps, upper, lower, both))
    return [fsdp.gathered(p) for p in both], saved, (lower, upper, cur)


def _save(problems):
    buf = io.BytesIO()
    torch.save([fsdp.gathered(p) for p in problems], buf)
    return buf.getvalue()


def run_reference(name, kind, world, streams, steps):
    net, weights = modules()
    lo_opt, up_opt = make_optimizers(kind)
    theta, x = tuple(net.parameters()), tuple(weights.parameters())
    keys_t, keys_x = [k for k, _ in net.named_parameters()], [k for k, _ in weights.named_parameters()]
    cur = {"step": 0}

    def at(s):
        return batch_at(s, cur["step"], 0, B * world, world)

    def lo(th, xx):
        return lower_loss(lambda i: functional_call(net, dict(zip(keys_t, th)), (i,)),
                          lambda i: functional_call(weights, dict(zip(keys_x, xx)), (i,)), at(streams[0]))
    up_state = up_opt.init(x)
    lower = Problem("lower", theta, lo, ("lower", "upper"), lo_opt)
    for step in range(steps):
        cur["step"] = step
        g = torch.autograd.grad(lo(theta, x), theta)
        with torch.no_grad():
            lower.state = lo_opt.commit(g, lower.state, theta)
        if name == "plain":
            continue
        top = upper_loss(net, weights, at(streams[1]))
        direct = torch.autograd.grad(top, x, allow_unused=True, retain_graph=True)
        h = [d if d is not None else torch.zeros_like(p) for d, p in zip(direct, x)]
        if name != "first_order":
            method = (sama if name == "sama" else finite_diff)(eps=0.01)
            fd = method.two_level(lower, [theta, x], (), lambda: upper_loss(net, weights, at(streams[1])),
                                  (), theta, x)
            h = [a + b for a, b in zip(h, fd(accumulate=False))]
        with torch.no_grad():
            up_state = up_opt.commit(tuple(h), up_state, x)
    return [[p.detach() for p in theta], [p.detach() for p in x]]


def rel(a, b):
    return max(((u - v).abs().max() / v.abs().max().clamp_min(1e-30)).item() for u, v in zip(a, b))


CASES = [("plain", "sgd"), ("plain", "adam"), ("first_order", "sgd"), ("finite_diff", "sgd"),
         ("sama", "sgd"), ("sama", "adam"), ("sama", "sgd", "recompute")]


def errors(rank, world, dtype):
    """The largest relative difference from the one-process reference, per case, in ``dtype``."""
    torch.set_default_dtype(dtype)
    streams, out = data(world), {}
    for name, kind, *recompute in CASES:
        got, _, _ = run_sharded(name, kind, rank, world, streams, STEPS, recompute=bool(recompute))
        ref = run_reference(name, kind, world, streams, STEPS)
        out["/".join([name, kind, *recompute])] = max(rel(g["params"], r) for g, r in zip(got, ref))
    return out


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "float32": errors(rank, world, torch.float32),
           "float64": errors(rank, world, torch.float64)}
    out["resume_bitwise"] = _resume(rank, world, data(world))
    out["refused"] = _refused()
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def _resume(rank, world, streams):
    """A run resumed from the gathered state of step 2 (fresh sharded modules) equals the
    uninterrupted run bitwise, parameters and optimizer state."""
    whole, saved, _ = run_sharded("sama", "adam", rank, world, streams, STEPS, resume_at=2)
    _, _, (lower, upper, cur) = run_sharded("sama", "adam", rank, world, streams, 0)
    for p, s in zip((lower, upper), torch.load(io.BytesIO(saved), weights_only=False)):
        fsdp.load_gathered(p, s)
    method, both = methods.sama(), (lower, upper)
    for step in range(2, STEPS):
        cur["step"] = step
        fsdp.plain_step(lower, both)
        upper.commit(fsdp.hypergradient(method, METHODS["sama"].caps, upper, lower, both))
    again = [fsdp.gathered(p) for p in both]
    same = all(torch.equal(a, b) for w, g in zip(whole, again) for a, b in zip(w["params"], g["params"]))
    return same and all(torch.equal(a, b) for w, g in zip(whole, again)
                        for f in ("mu", "nu") for a, b in zip(getattr(w["state"], f), getattr(g["state"], f)))


def _refused():
    try:
        fsdp.hypergradient(methods.neumann(), METHODS["neumann"].caps, None, None, ())
    except ValueError as e:
        return str(e)
    return None


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
