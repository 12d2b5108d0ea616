"""A program's training state: snapshot, restore, and a problem's restart.

:func:`snapshot` covers parameters, optimizer states, module buffers, data positions,
RNGs and the step counters, so a run resumed by :func:`restore` is bitwise identical to an
uninterrupted one on CPU. Under `strategy = fsdp` (and `zero`) every tensor is whole,
gathered from the ranks, so a checkpoint resumes into any strategy and world size. Optimizer states are pytrees: cloned (a commit overwrites the
live tensors in place) and turned into checkpointable plain trees here, and nowhere else
in the engine.

A problem's parameters that are its module's are copied once: ``params`` and ``module``
refer to the same copies (:mod:`mloc.runtime.program.clones`), so the file holds each
parameter's bytes once (``torch.save`` writes a shared storage once). :func:`restore` only
copies *from* them (``load_state_dict``, then ``params``: the same values into the same
tensors), so checkpoints written before, with separate copies, restore the same way.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from mloc.runtime.base import tree
from mloc.runtime.program import fsdp_run
from mloc.runtime.program.clones import Clones
from mloc.runtime.program.checkpoint import capture_rng, restore_rng, state_to_tree, tree_to_state
from mloc.runtime.program.data import DataStream
from mloc.runtime.optim.zero import Zero, ZeroState


def snapshot(name: str, step: int, live: Mapping[str, Any], streams: Mapping[str, DataStream],
             sharded: bool = False) -> dict:
    """The state of program ``name`` after ``step`` outer steps (``live``: each problem's
    :class:`mloc.runtime.program.build.Live`). ``sharded``: a `zero` problem's optimizer
    state is this rank's shard, ``{"shard": {"index": [owned parameters], "state": plain}}``
    (a sharded checkpoint's: :mod:`mloc.runtime.program.sharded`), not gathered."""
    problems = {}
    for n, lv in live.items():
        if lv.shards is not None:      # strategy fsdp: whole tensors, gathered (every rank calls)
            problems[n] = {**fsdp_run.gathered(lv), "steps": lv.steps}
            continue
        clones = Clones()               # a parameter of the module is in `module` and `params`: one copy
        module = {k: clones(v) for k, v in lv.module.state_dict().items()}
        problems[n] = {"params": [clones(p) for p in lv.problem.params],
                       "optimizer": _shard(lv.problem) if sharded and isinstance(lv.problem.optimizer, Zero)
                       else _whole(lv.problem),
                       "module": module, "steps": lv.steps}
    return {"program": name, "step": step, "problems": problems,
            "data": {n: s.state() for n, s in streams.items()}, "rng": capture_rng()}


def restore(state: dict, live: Mapping[str, Any], streams: Mapping[str, DataStream]) -> int:
    """Load :func:`snapshot`'s ``state`` into the problems and streams; returns its step.
    Every problem's current batch is dropped (the next step draws)."""
    step = int(state["step"])
    for n, lv in live.items():
        saved = state["problems"][n]
        lv.steps = int(saved["steps"])
        if lv.shards is not None:      # strategy fsdp: this rank's shards of the whole tensors
            fsdp_run.load(lv, saved)
            continue
        lv.module.load_state_dict(saved["module"])
        with torch.no_grad():
            for p, v in zip(lv.problem.params, saved["params"]):
                p.copy_(v)
        # copies: commits overwrite the state's tensors in place (Optimizer.commit)
        lv.problem.state = _restored(lv.problem, saved["optimizer"])
    for n, s in streams.items():
        s.restore(state["data"][n])
    for lv in live.values():
        lv.batch = None
    restore_rng(state["rng"])
    return step


def _whole(problem) -> Any:
    """The problem's optimizer state as a checkpoint holds it: whole, gathered from the
    ranks under `strategy = zero` (every rank calls), so it resumes into any world size."""
    if isinstance(problem.optimizer, Zero):
        return problem.optimizer.gathered(problem.state, problem.params)
    return state_to_tree(tree.clone(problem.state))


def _shard(problem) -> dict:
    """This rank's shard of a `zero` problem's optimizer state, cloned, as a plain tree."""
    opt = problem.optimizer
    return {"shard": {"index": list(opt.owned(problem.params)),
                      "state": state_to_tree(tree.clone(opt.local(problem.state, problem.params)))}}


def _restored(problem, plain: Any) -> Any:
    """A checkpoint's whole optimizer state as the problem's (its shard under `zero`; or
    this rank's shard as :func:`_shard` holds it, under `zero` with the same partition),
    copied: commits overwrite the state's tensors in place (Optimizer.commit)."""
    opt = problem.optimizer
    if isinstance(opt, Zero):
        mine = plain["shard"]["state"] if type(plain) is dict and set(plain) == {"shard"} \
            else opt.select(plain, problem.params)
        local = tree_to_state(mine, opt.local(problem.state, problem.params))
        return ZeroState({"state": tree.clone(local)})
    return tree.clone(tree_to_state(plain, problem.state))


def restart(problem, start=None) -> None:
    """Start ``problem`` again with a fresh optimizer state, from ``start``: a tuple of
    tensors to copy, a callable that sets the parameters (called under no_grad), or None
    for zero parameters (the ``δ`` of an ``init`` problem)."""
    with torch.no_grad():
        if start is None:
            for p in problem.params:
                p.zero_()
        elif callable(start):
            start()
        else:
            for p, s in zip(problem.params, start):
                p.copy_(s)
    problem.state = problem.optimizer.init(problem.params)
