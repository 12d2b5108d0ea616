"""Activation checkpointing of user modules: each child recomputes its activations in the
backward instead of keeping them (``torch.utils.checkpoint``, non-reentrant).

:func:`recompute_children` replaces, on the instance, the ``forward`` of every direct child
of a module that holds parameters: the child's forward runs under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, which keeps only the
child's inputs and runs the forward again when the backward reaches it (Chen et al.,
"Training Deep Nets with Sublinear Memory Cost", 2016: the activations inside a child are
traded for one more forward of it). Parameter names, ``state_dict`` keys and hooks
(FSDP2's included) are unchanged, since the module tree is.

**Why the parameters are inputs of the checkpoint.** mloc evaluates losses at points that
are not the modules' own parameters by putting other tensors in the modules' places for the
duration of a call (:mod:`mloc.runtime.program.binding`, as ``functional_call`` does). A
plain checkpoint would recompute in the backward with whatever the module holds *then*, the
module's own parameters: silently wrong gradients at ``θ ± εq`` or an unrolled point. Here
the tensors the child holds when its forward runs are passed to ``checkpoint`` as inputs,
and the recomputation puts those same tensors back in place: the recomputed forward is the
one that ran. It composes with double backward (Hessian-vector products through a
checkpointed child are exact: tests/runtime/test_recompute.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


def recompute_children(module: nn.Module) -> tuple[str, ...]:
    """Checkpoint each direct child of ``module`` that holds parameters (in place); the
    names of the children changed. A module without children with parameters is left as
    it is (checkpointing its whole forward saves nothing a loss does not hold anyway)."""
    done = []
    for name, child in module.named_children():
        if any(True for _ in child.parameters()) and not getattr(child, "_mloc_recomputed", False):
            _wrap(child)
            done.append(name)
    return tuple(done)


def _wrap(child: nn.Module) -> None:
    original = child.forward
    places = [n.rpartition(".") for n, _ in child.named_parameters()]
    places = [(child.get_submodule(path), attr) for path, _, attr in places]

    def run(*values: Any, **kwargs: Any):
        saved = []
        try:
            for (owner, attr), v in zip(places, values):
                saved.append((owner, attr, owner._parameters[attr]))
                owner._parameters[attr] = v
            return original(*values[len(places):], **kwargs)
        finally:
            for owner, attr, t in reversed(saved):
                owner._parameters[attr] = t

    def forward(*args: Any, **kwargs: Any):
        held = [owner._parameters[attr] for owner, attr in places]
        return checkpoint(run, *held, *args, use_reentrant=False, **kwargs)

    child.forward = forward
    child._mloc_recomputed = True
