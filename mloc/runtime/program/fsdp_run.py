r"""`strategy = fsdp` in the run path: every problem's module sharded by FSDP2, its steps
taken by :mod:`mloc.runtime.base.fsdp`, its checkpoints gathered.

With ``N > 1`` processes :func:`shard` wraps each module with :func:`fsdp.shard` right after
the trainable parameters are chosen, and each problem's parameters become the **local
shards** (detached views of FSDP's storage): mloc's functional optimizer, the learning-rate
schedule, the NaN/Inf watches and the step counter of the commit pipeline
(:mod:`mloc.runtime.grad.commit`) then act on ``1/N`` of every tensor, unchanged. What
differs is where the gradients come from (:class:`Steps`):

- a lowest problem's step: :func:`fsdp.gradients` of its loss, ``L(θ, x)`` evaluated by the
  sharded modules' own forwards on this rank's batch, one ``backward()`` whose
  reduce-scatter averages the shards over the ranks;
- an upper's step: :func:`fsdp.hypergradient` with the edge's method (``sama``,
  ``finite_diff``, ``first_order``: the registry's ``MethodCaps.shards``):
  ``∇_x F - (∇_x L(θ+εq, x) - ∇_x L(θ-εq, x)) / 2ε``, the points ``θ ± εq`` made in place on
  the shards;
- the other modules' buffers are kept as they were (the buffer rule of
  :mod:`mloc.runtime.grad.buffers`); an upper whose own module has buffers is refused.

The gradients arrive averaged, so the pipeline is built without its all-reduce stage. The
run's precision is autocast around the sharded forwards (the finite-difference passes with
it off), not FSDP2's ``MixedPrecisionPolicy`` (docs/runtime.md, "Precision under fsdp").
``Program.hypergradients()`` is :meth:`Steps.hypergradient`: collective, whole tensors.
Checkpoints hold whole tensors (:func:`gathered`, every rank calls it), the format a ``ddp``
run writes: they resume into ``ddp``, ``zero`` or ``fsdp`` at any world size
(:func:`load`). Evaluations run the sharded modules' forwards on every rank. What the run
path refuses under fsdp, and why, is :mod:`mloc.shared.sharding` (exit 2 here, E221 at
`mloc check`). Zhao et al., "PyTorch FSDP", VLDB 2023.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from mloc.runtime.base import fsdp, tree
from mloc.runtime.base.overlap import OverlappedSync
from mloc.runtime.files.options import OptionError
from mloc.runtime.grad.buffers import buffers_of, frozen
from mloc.runtime.program.checkpoint import state_to_tree, tree_to_state
from mloc.runtime.program.clones import Clones
from mloc.shared.sharding import ProblemFacts, refusals

_STEP_KINDS = ("accumulate", "apply", "meta_batch", "chain_step")


def refuse(config: Any, specs: Sequence[Any], edges: Sequence[Any], chains: Sequence[Any], schedule: Any) -> None:
    """Under ``config.strategy`` fsdp, an :class:`OptionError` (exit 2) naming the first thing
    of the program that it cannot run (:func:`mloc.shared.sharding.refusals`). A train.py holds
    no `accumulate` field: the schedule's calls say it (the generated schedule's code names
    the step kinds it calls)."""
    if config.strategy != "fsdp":
        return
    names = set(getattr(getattr(schedule, "__code__", None), "co_names", ()))
    facts = tuple(ProblemFacts(
        s.name, _optimizer_name(s.optimizer(s.lr)),
        lowers=tuple(e.lower for e in edges if e.upper == s.name),
        uppers=tuple(e.upper for e in edges if e.lower == s.name),
        precision=s.precision, clip=s.clip_grad_norm is not None, init=s.init is not None,
        reinit=s.reinit is not False, project=s.project is not None,
        accumulate=bool(names & set(_STEP_KINDS[:3]))) for s in specs)
    found = refusals(facts, chains=bool(chains), compile=config.compile)
    for e in edges:
        caps = method_caps(e)
        if not caps.shards:
            found.append((f"`{type(e.method).__name__}` on `{e.upper} -> {e.lower}`: {caps.unsharded_reason}",
                          "give this edge a method that runs on shards (`mloc explain E220`), or use `--strategy zero`"))
    if found:
        why, help = found[0]
        raise OptionError(f"strategy fsdp cannot run this program: {why}", help)


def _optimizer_name(optimizer: Any) -> str:
    kind = type(optimizer).__name__.lower()
    return "shampoo" if "shampoo" in kind else "torch" if kind.startswith("torch") else kind


@dataclass(frozen=True)
class EdgeCaps:
    """What :func:`mloc.runtime.base.fsdp.hypergradient` reads of an edge's method, from the
    generated ``Edge``'s ``sharded`` form (the registry's ``MethodCaps.sharded_form``)."""

    shards: bool
    no_indirect: bool = False
    needs: frozenset = frozenset()
    unsharded_reason: str = "it is not a method that runs on shards (`mloc explain E220` says which do, and why)"


def method_caps(edge: Any) -> EdgeCaps:
    """The :class:`EdgeCaps` of a runtime ``Edge`` (none without its ``sharded`` form)."""
    form = getattr(edge, "sharded", None)
    return EdgeCaps(shards=form is not None, no_indirect=form == "direct",
                    needs=frozenset({"sama_diag"}) if form == "preconditioned" else frozenset())


def shard(live: Mapping[str, Any]) -> None:
    """Shard every problem's module (FSDP2) and make its trainable parameters the local
    shards (``lv.params``; ``lv.shards``: the sharded parameters, ``DTensor``\\ s)."""
    for lv in live.values():
        fsdp.shard(lv.module)
        named = dict(lv.module.named_parameters())
        lv.shards = tuple(named[s] for s in lv.slots)
        with torch.no_grad():
            lv.params = tuple(fsdp.local(p).detach() for p in lv.shards)


class _View:
    """One problem as :mod:`mloc.runtime.base.fsdp` reads it (a ``Sharded``'s attributes),
    over the run's :class:`~mloc.runtime.program.build.Live`: its loss is the spec's call on
    the sharded modules it reads and the current batch, under the problem's precision
    (autocast around the sharded forwards, as in one process; ``precise``: none); the first
    value of each step is kept (``seen``)."""

    def __init__(self, lv: Any, live: Mapping[str, Any], precise: bool = False):
        self.lv, self.name, self.module, self.params = lv, lv.spec.name, lv.module, lv.shards
        self.reads = [live[r].module for r in lv.spec.reads]
        self.autocast = contextlib.nullcontext if precise else lv.autocast
        self.seen: list = []

    optimizer = property(lambda self: self.lv.problem.optimizer)
    state = property(lambda self: self.lv.problem.state)
    local = property(lambda self: self.lv.problem.params)

    def loss(self) -> torch.Tensor:
        with self.autocast():
            value = self.exact_loss()
        self.seen.append(value)
        return value

    def exact_loss(self) -> torch.Tensor:
        """The loss without the problem's autocast region (the finite-difference passes of
        :func:`~mloc.runtime.base.fsdp.hypergradient` run it with autocast off)."""
        return self.lv.spec.loss(*self.reads, self.lv.batch)

    def taken(self) -> torch.Tensor | None:
        """The step's first loss, detached; ``seen`` emptied."""
        first = self.seen[0].detach() if self.seen else None
        self.seen.clear()
        return first


class Steps:
    """The gradient sources of a sharded run (the module docstring), one per problem."""

    def __init__(self, live: Mapping[str, Any], edges: Sequence[Any]):
        self.live = live
        self.views = {n: _View(lv, live) for n, lv in live.items()}
        self.everyone = tuple(self.views.values())
        self.lower_of = {e.upper: e for e in edges}
        self.sync = OverlappedSync(1)       # the pipeline's: the gradients arrive averaged
        for name in self.lower_of:
            if any(True for _ in live[name].module.buffers()):
                raise OptionError(f"strategy fsdp: the upper problem `{name}`'s module has buffers (BatchNorm "
                                  "statistics), which its sharded step does not keep as a ddp step does",
                                  "use `--strategy zero` or ddp")

    def source(self, name: str):
        """``source(seed) -> (grads, loss)`` of problem ``name``: local shards, averaged."""
        view = self.views[name]
        edge = self.lower_of.get(name)
        own = tuple(view.module.buffers())
        others = buffers_of((v.module for v in self.everyone), exclude=own if edge is None else ())
        if edge is None:
            def plain(seed=None):
                with frozen(others):
                    (grads,) = fsdp.gradients(view.loss, [view], self.everyone)
                return grads, view.taken()
            return plain
        lower, caps = self.views[edge.lower], method_caps(edge)

        def upper(seed=None):
            with frozen(others):
                grads = fsdp.hypergradient(edge.method, caps, view, lower, self.everyone)
            lower.seen.clear()
            return grads, view.taken()
        return upper

    def hypergradient(self, name: str) -> dict[str, torch.Tensor]:
        """Upper ``name``'s hypergradient as whole tensors by slot, at the current parameters
        and batches, as one process's ``Program.hypergradients()`` takes it: in full precision
        (no autocast), every buffer frozen, every parameter's ``.grad`` put back as it was (the
        sharded step clears the ``.grad`` of the two problems it differentiates), nothing
        stepped. Every rank calls (the forwards and the result are gathered)."""
        edge = self.lower_of[name]
        views = {n: _View(self.live[n], self.live, precise=True) for n in (name, edge.lower)}
        saved = [(p, p.grad) for v in self.everyone for p in v.params]
        try:
            with frozen(buffers_of(v.module for v in self.everyone)):
                local = fsdp.hypergradient(edge.method, method_caps(edge), views[name], views[edge.lower],
                                           self.everyone)
        finally:
            for p, g in saved:
                p.grad = g
        view = self.views[name]
        return {s: fsdp.whole(p, g) for s, p, g in zip(view.lv.slots, view.params, local)}

    def losses(self) -> dict[str, float]:
        """Each problem's loss on its current batch (every rank calls: the forwards gather)."""
        out = {}
        with torch.no_grad(), frozen(buffers_of(v.module for v in self.everyone)):
            for name, view in self.views.items():
                if view.lv.batch is not None:
                    out[name] = float(view.loss())
                    view.seen.clear()
        return out


def _whole_view(lv: Any) -> Any:
    return type("V", (), {"params": lv.shards, "state": lv.problem.state})()


def gathered(lv: Any) -> dict:
    """Problem ``lv``'s checkpoint entries as whole tensors, as a ``ddp`` run writes them
    (every rank calls: each shard is all-gathered, a parameter once for ``params`` and
    ``module``: :mod:`mloc.runtime.program.clones`)."""
    clones = Clones(lambda v: v.full_tensor() if isinstance(v, fsdp.DTensor) else v.detach().clone())
    module = {k: clones(v) for k, v in lv.module.state_dict(keep_vars=True).items()}
    params = [clones(p) for p in lv.shards]     # the module's own: gathered once, in `module` too
    state = fsdp.gathered_state(_whole_view(lv))
    return {"params": params, "optimizer": state_to_tree(tree.clone(state)), "module": module}


def load(lv: Any, saved: dict) -> None:
    """Put a checkpoint's whole tensors (from any strategy and world size) back: this
    rank's shard of each parameter and optimizer tensor, every buffer whole."""
    with torch.no_grad():
        for k, v in lv.module.state_dict().items():
            fsdp.local(v).copy_(fsdp.part(v, saved["module"][k]) if isinstance(v, fsdp.DTensor) else saved["module"][k])
    view = _whole_view(lv)
    whole = fsdp.gathered_state(view)           # the whole state's structure and shapes, to check against
    state = tree_to_state(saved["optimizer"], whole)
    fsdp.load_gathered(view, {"params": saved["params"], "state": state})
    lv.problem.state = tree.clone(view.state)


def param_bytes(modules: Sequence[nn.Module]) -> int:
    """The bytes of parameters this rank holds (its shards, when sharded)."""
    return sum(fsdp.param_bytes(m) for m in modules)
