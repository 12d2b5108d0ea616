"""The runtime's containers: parameter tuples and pytrees.

- Arithmetic on parameter tuples (``Params = tuple[Tensor, ...]``): a problem's
  parameters, gradients and adjoints are flat tuples of tensors, built once. These helpers
  are plain loops: for the handful of tensors of a model they cost less than dispatching
  a foreach kernel, and they stay differentiable.
- The one pytree walker (:func:`map_tensors`) and what is built on it: every optimizer
  state (NamedTuples, tuples, lists, dicts, nested to any depth, with numbers among the
  tensors), every data batch and every checkpoint payload is cloned, moved, flattened and
  converted to a checkpointable plain tree by these functions and no others.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

Params = tuple[Tensor, ...]


def dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """⟨a, b⟩ summed over all tensors of the tuples (a 0-dim tensor, no host sync)."""
    total = (a[0] * b[0]).sum()
    for x, y in zip(a[1:], b[1:]):
        total = total + (x * y).sum()
    return total


def norm(a: Sequence[Tensor]) -> Tensor:
    """Euclidean norm of the concatenation of ``a``."""
    total = (a[0] * a[0]).sum()
    for x in a[1:]:
        total = total + (x * x).sum()
    return torch.sqrt(total)


def axpy(alpha, x: Sequence[Tensor], y: Sequence[Tensor]) -> Params:
    """``alpha * x + y``; ``alpha`` is a number or a 0-dim tensor. For a number, one fused
    kernel per tensor (``torch.add(y, x, alpha=alpha)``, a multiply-add) instead of two."""
    if isinstance(alpha, (int, float)):
        return tuple([torch.add(yi, xi, alpha=alpha) for xi, yi in zip(x, y)])
    return tuple([alpha * xi + yi for xi, yi in zip(x, y)])


def scale(alpha, x: Sequence[Tensor]) -> Params:
    """``alpha * x``."""
    return tuple([alpha * xi for xi in x])


def mul(x: Sequence, y: Sequence[Tensor]) -> Params:
    """Elementwise ``x ⊙ y``; entries of ``x`` may be numbers (a per-tensor scale)."""
    return tuple([xi * yi for xi, yi in zip(x, y)])


def add(x: Sequence[Tensor], y: Sequence[Tensor]) -> Params:
    return tuple([xi + yi for xi, yi in zip(x, y)])


def neg(x: Sequence[Tensor]) -> Params:
    return tuple([-xi for xi in x])


def detach(x: Sequence[Tensor], requires_grad: bool = False) -> Params:
    """Detached copies; with ``requires_grad`` they are fresh autograd leaves."""
    return tuple([xi.detach().requires_grad_(requires_grad) for xi in x])


def fill_none(grads: Sequence[Tensor | None], like: Sequence[Tensor]) -> Params | None:
    """Replace ``None`` gradients (unused inputs) by zeros; ``None`` if all were unused."""
    for g in grads:  # a plain loop: this sits on the hot path
        if g is None:
            break
    else:
        return tuple(grads)
    if all(g is None for g in grads):
        return None
    return tuple([torch.zeros_like(p) if g is None else g for g, p in zip(grads, like)])


def zeros(like: Sequence[Tensor]) -> Params:
    return tuple([torch.zeros_like(p) for p in like])


class Dense(tuple):
    """Gradients made dense: the entries autograd left undefined (``None``: no path from the
    loss to that parameter) are zeros, and ``absent`` holds their indices. A commit leaves
    those parameters and their optimizer state as they were
    (:func:`mloc.runtime.optim.commit_present`), as ``torch.optim`` skips a parameter whose
    ``.grad`` is None: weight decay and momentum do not move a parameter nothing reaches."""

    absent: tuple[int, ...] = ()


def absent(grads: Sequence) -> tuple[int, ...]:
    """The indices of ``grads`` that had no gradient (:class:`Dense`; ``()`` for any other)."""
    return getattr(grads, "absent", ())


def marked(grads: Sequence[Tensor], missing: Sequence[int]) -> Params:
    """``grads`` (dense) as a tuple that says which entries had no gradient (:class:`Dense`);
    a plain tuple when none."""
    if not missing:
        return tuple(grads)
    out = Dense(grads)
    out.absent = tuple(missing)
    return out


def dense(grads: Sequence[Tensor | None], like: Sequence[Tensor]) -> Params:
    """Like :func:`fill_none`, but all zeros rather than ``None`` when nothing was used; the
    entries that were ``None`` are remembered (:class:`Dense`)."""
    for g in grads:  # a plain loop: this sits on the hot path
        if g is None:
            break
    else:
        return grads if type(grads) is Dense else tuple(grads)    # already dense: kept, marks too
    return marked([torch.zeros_like(p) if g is None else g for g, p in zip(grads, like)],
                  [i for i, g in enumerate(grads) if g is None])


# --- pytrees --------------------------------------------------------------------------------

def map_tensors(tree: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``tree`` with ``fn`` applied to every tensor, through tuples (named too), lists and
    dicts, in field/insertion order; anything else is returned as it is."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_tensors(b, fn) for b in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(b, fn) for b in tree)
    if isinstance(tree, dict):
        return {k: map_tensors(v, fn) for k, v in tree.items()}
    return tree


def tensors(tree: Any) -> Params:
    """The tensors of ``tree``, in :func:`map_tensors` order (numbers and other leaves
    skipped)."""
    out: list[Tensor] = []
    map_tensors(tree, out.append)
    return tuple(out)


def replace_tensors(tree: Any, new: Sequence[Tensor]) -> Any:
    """``tree`` with its tensors replaced, in order, by ``new`` (the inverse of
    :func:`tensors`)."""
    it = iter(new)
    return map_tensors(tree, lambda _: next(it))


def clone(tree: Any) -> Any:
    """``tree`` with every tensor detached and copied (a snapshot that an in-place commit
    does not change)."""
    return map_tensors(tree, lambda t: t.detach().clone())


class StructureMismatch(ValueError):
    """A plain tree that does not have the structure of the state it should restore.
    ``where`` names the entry (``state.mu[1]``), ``what`` says what is wrong."""

    def __init__(self, where: str, what: str):
        super().__init__(f"`{where}` {what}")
        self.where, self.what = where, what


def to_plain(tree: Any) -> Any:
    """A tree a checkpoint can hold without code: NamedTuples become ``{"_type": name,
    field: value, ...}``, other tuples and lists become lists; tensors, numbers, strings and
    ``None`` stay as they are. :func:`from_plain` inverts it."""
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return {"_type": type(tree).__name__, **{f: to_plain(getattr(tree, f)) for f in tree._fields}}
    if isinstance(tree, (tuple, list)):
        return [to_plain(v) for v in tree]
    if isinstance(tree, dict):
        return {k: to_plain(v) for k, v in tree.items()}
    return tree


def from_plain(plain: Any, like: Any, where: str = "state") -> Any:
    """The tree of ``plain`` (from :func:`to_plain`), shaped like ``like`` (e.g. a fresh
    ``opt.init(params)``): same types, field names, lengths, tensor shapes and dtypes;
    tensors are moved to ``like``'s devices. A mismatch raises :class:`StructureMismatch`
    naming the entry (``where``: the name of the root)."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        name = type(like).__name__
        if type(plain) is not dict or plain.get("_type") != name or set(plain) != {"_type", *like._fields}:
            raise StructureMismatch(where, f"is not a {name}")
        return type(like)(*(from_plain(plain[f], getattr(like, f), f"{where}.{f}") for f in like._fields))
    if isinstance(like, (tuple, list)):
        if not isinstance(plain, (tuple, list)) or len(plain) != len(like):
            raise StructureMismatch(where, f"does not hold {len(like)} entries")
        return type(like)(from_plain(t, l, f"{where}[{i}]") for i, (t, l) in enumerate(zip(plain, like)))
    if isinstance(like, dict):
        if type(plain) is not dict or set(plain) != set(like):
            raise StructureMismatch(where, f"does not have the keys {sorted(map(str, like))}")
        return {k: from_plain(plain[k], v, f"{where}[{k!r}]") for k, v in like.items()}
    if isinstance(like, Tensor):
        if not isinstance(plain, Tensor) or plain.shape != like.shape or plain.dtype != like.dtype:
            got = (f"{tuple(plain.shape)} {plain.dtype}" if isinstance(plain, Tensor)
                   else type(plain).__name__)
            raise StructureMismatch(where, f"is {got}, the program's is {tuple(like.shape)} {like.dtype}")
        return plain.to(like.device)
    if type(plain) is not type(like):
        raise StructureMismatch(where, f"is a {type(plain).__name__}, the program's is a {type(like).__name__}")
    return plain
