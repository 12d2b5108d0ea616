r"""Gradient averaging across replicas, bucketed and overlapped with the backward that makes it.

Data parallelism needs, at every point where a gradient is not linear in the replicas'
batches, the mean over replicas of a gradient each replica computed on its own shard:
``ḡ = (1/N) Σ_r ∇_θ L_r``. With equal shards that is the gradient of the mean loss over
the global batch. :class:`OverlappedSync` computes it in one call,
``sync.grad(outputs, inputs, grad_outputs)`` = ``mean_r autograd.grad(outputs, inputs,
grad_outputs)``, in two ways that give the same numbers:

- **overlapped** (the default): the ``inputs`` are laid out in buckets by
  :class:`Bucketer` (DDP's layout: about ``cap_bytes`` each, 25 MiB by default, with a
  1 MiB bucket for the tensors defined first; one dtype and device per bucket; launched
  last-defined first, as autograd tends to produce them).
  A hook on each input (``Tensor.register_hook``, registered for this one call and
  removed after: a hook that stayed would fire in every other backward through the same
  tensors, e.g. a Hessian-vector product's) copies its gradient into its bucket's slot as
  autograd produces it; when a bucket is complete, and every bucket before it has been
  launched, its ``all_reduce(async_op=True)`` starts while the rest of the backward runs.
  After the backward, inputs no gradient reached are filled with zeros (a replica on which
  a parameter is unused sends zeros, as every replica must send the same layout), the
  remaining buckets are launched, all are waited for and divided by ``N``.
- **flat** (``overlap=False``): ``autograd.grad``, then one ``all_reduce`` per dtype of the
  flattened gradients after the backward (:meth:`OverlappedSync.mean`).

Each element is the same two-operand (or N-operand) sum in both, so for a world of two
the two paths agree bit for bit; in general, up to the collective's summation order.
Buckets are launched in bucket order only, never in readiness order: every replica then
issues the same collectives in the same order even when its backward ran differently
(gloo and nccl require it), which is DDP's rule too.

**Why hooks and not DistributedDataParallel itself.** DDP's reducer is driven by
``AccumulateGrad`` (a gradient landing in ``.grad`` through ``backward()``) and is armed by
the wrapped module's ``forward``. mloc's sources take gradients with
``torch.autograd.grad`` (into nothing), and the averaged parts of a hypergradient (the
upper's direct gradient, each Hessian-vector product, SAMA's lower gradient) are
gradients with respect to tensors that are no module's parameters of that forward, taken
several times per step from one forward, sometimes of outputs that are themselves
gradients. None of those is a DDP step. Tensor hooks fire for exactly the inputs of the
``autograd.grad`` call they are registered for, with each input's total gradient, once: the
same event DDP's autograd hook uses, on every step shape. The price against DDP is one
hook registration per input per call (~2 µs each on this CPU) and no
``gradient_as_bucket_view`` (one copy per gradient into its bucket, as DDP does without it).

**Counting.** Every collective, either path, is counted per problem (the one named by
:attr:`OverlappedSync.owner`, set by the engine before each problem's step); the train
records carry ``collectives`` per outer step (:meth:`OverlappedSync.take`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from mloc.runtime.base import tree

DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's default ``bucket_cap_mb`` (25 MiB)."""

FIRST_BUCKET_BYTES = 2**20
"""DDP's first bucket under its default cap (``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB)."""

AllReduce = Callable[[Tensor], Any]
"""Starts an in-place sum of a tensor across replicas and returns something with ``wait()``."""


def async_all_reduce(t: Tensor) -> Any:
    """``dist.all_reduce(t, SUM, async_op=True)``: the default collective."""
    return dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)


class _Captured:
    """The sum of ``t`` across replicas as functional collectives (``_c10d_functional``'s
    ``all_reduce`` and ``wait_tensor``, dispatcher operations, so ``make_fx`` records them
    and TorchInductor runs them, on gloo too): how a compiled step's graph holds the
    averaging of an upper step under ``--nproc`` (``c10d``'s in-place ``dist.all_reduce``
    is invisible to the tracer). ``wait()`` writes the sum into ``t``, as the eager one."""

    def __init__(self, t: Tensor):
        self.t = t
        self.sum = torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name)

    def wait(self) -> None:
        self.t.copy_(torch.ops._c10d_functional.wait_tensor(self.sum))


@dataclass(frozen=True)
class Bucketer:
    """A bucket layout of a tuple of tensors, DDP's: ``buckets[k]`` holds indices into it,
    each bucket one dtype and device, in launch order. The rule is
    ``torch.distributed._compute_bucket_assignment_by_size``'s, which DDP's constructor
    calls on the parameters in the order they are defined: each tensor joins the open bucket
    of its dtype and device, and a bucket closes as soon as it holds at least its limit (so
    it can pass the limit by its last tensor). The first bucket of each dtype and device has
    the limit ``first_bytes``, the others ``cap_bytes``; with DDP's default cap the first is
    1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``): the tensors defined first get their
    gradients last, so a small bucket for them leaves little to send once the backward has
    ended. The buckets are then sorted by their first index and reversed, so that the last
    tensors' bucket, whose gradients autograd makes first, is launched first."""

    buckets: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]              # elements per bucket

    @classmethod
    def of(cls, tensors: Sequence[Tensor], cap_bytes: int = DDP_BUCKET_BYTES,
           first_bytes: int | None = None) -> Bucketer:
        if cap_bytes <= 0:
            raise ValueError(f"a bucket holds at least one byte, not {cap_bytes}")
        if first_bytes is None:
            first_bytes = FIRST_BUCKET_BYTES if cap_bytes == DDP_BUCKET_BYTES else cap_bytes
        closed: list[list[int]] = []
        opened: dict[tuple, list] = {}          # key -> [indices, bytes, buckets closed]
        for i, t in enumerate(tensors):
            entry = opened.setdefault((t.dtype, t.device), [[], 0, 0])
            entry[0].append(i)
            entry[1] += t.numel() * t.element_size()
            if entry[1] >= (first_bytes if entry[2] == 0 else cap_bytes):
                closed.append(entry[0])
                entry[:] = [[], 0, entry[2] + 1]
        closed.extend(e[0] for e in opened.values() if e[0])
        closed.sort(key=lambda m: -m[0])
        buckets = tuple(tuple(m) for m in closed)
        return cls(buckets, tuple(sum(tensors[i].numel() for i in b) for b in buckets))


class OverlappedSync:
    """Averages gradients across ``world`` replicas (see the module docstring).

    ``overlap``: bucketed and overlapped (True) or flat after the backward (False);
    ``all_reduce``: starts one in-place sum (:func:`async_all_reduce`; a benchmark wraps it
    to delay each collective); ``cap_bytes``: the bucket size."""

    def __init__(self, world: int, overlap: bool = True, all_reduce: AllReduce = async_all_reduce,
                 cap_bytes: int = DDP_BUCKET_BYTES):
        self.world, self.overlap, self.all_reduce, self.cap_bytes = world, overlap, all_reduce, cap_bytes
        self.owner: str | None = None           # the problem whose step runs (counting)
        self.counts: dict[str | None, int] = {}  # collectives per owner since the last take
        self.taken_at = 0                       # the outer step of the last take
        self._layouts: dict[tuple, Bucketer] = {}
        self._mark: dict[int, Tensor] = {}      # the last averaged final gradients, by id

    def final(self, micro: bool = False) -> OverlappedSync | None:
        """What a step's source averages its final gradients with during the backward: this
        sync under data parallelism with overlap; None otherwise, and for a ``micro`` step of
        ``accumulate`` (their sum is averaged once, by the pipeline)."""
        return self if self.overlap and self.world > 1 and not micro else None

    def _count(self, collectives: int) -> None:
        self.counts[self.owner] = self.counts.get(self.owner, 0) + collectives

    def replayed(self, collectives: int) -> None:
        """Count ``collectives`` that a compiled graph ran (no Python saw them)."""
        self._count(collectives)

    def take(self, step: int) -> dict[str, float]:
        """Collectives per outer step of each problem since the last call (at outer step
        ``step``, 0-based steps done), then reset."""
        steps = max(step - self.taken_at, 1)
        counts, self.counts, self.taken_at = self.counts, {}, step
        return {n: c / steps for n, c in counts.items() if n is not None}

    # --- the two paths -------------------------------------------------------------------
    def grad(self, outputs, inputs: Sequence[Tensor], grad_outputs=None, retain_graph: bool | None = None,
             final: bool = False) -> tuple[Tensor, ...]:
        """``mean over replicas of autograd.grad(outputs, inputs, grad_outputs)``, dense (zeros
        where no gradient reaches). ``final``: these are a step's gradients, which the commit
        pipeline then finds averaged already (:meth:`reduced`), except while a compiled step
        is captured (``make_fx``: a graph holds no collective), when they are returned as
        they are, ``None`` where none reached, for the pipeline to average after. The inputs no gradient reached
        on this replica are marked (:func:`~mloc.runtime.base.tree.marked`), as a source marks them."""
        inputs = tuple(inputs)
        if final and get_proxy_mode() is not None:   # captured into a graph (a compiled step):
            return torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph,
                                       allow_unused=True)   # no collective there; the pipeline averages
        if not self.overlap or self.world == 1:
            g = torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph, allow_unused=True)
            missing = [i for i, x in enumerate(g) if x is None]
            out = self.mean([torch.zeros_like(t) if x is None else x for x, t in zip(g, inputs)])
        else:
            flight = _Flight(self._layout(inputs), inputs, self._start)
            handles = [t.register_hook(flight.hook(i)) for i, t in enumerate(inputs) if t.requires_grad]
            try:
                torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph, allow_unused=True)
            finally:
                for h in handles:
                    h.remove()
            missing = [i for i in range(len(inputs)) if i not in flight.arrived]
            out = flight.finish(self.world)
            self._count(len(flight.works))
        if final:
            self._mark = {id(t): t for t in out}
        return tree.marked(out, missing)

    @torch.no_grad()
    def mean(self, tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The flat path: new tensors, the average of ``tensors`` across replicas, one
        collective per dtype after everything is computed."""
        out = [t.detach().clone() for t in tensors]
        if self.world > 1:
            groups = _by_dtype(out)
            for group in groups:
                flat = torch.cat([t.reshape(-1) for t in group])
                self._start(flat).wait()
                flat.div_(self.world)
                _unflatten_into(flat, group)
            self._count(len(groups))
        return tuple(out)

    __call__ = mean

    def _start(self, t: Tensor) -> Any:
        """``all_reduce(t)`` started; while a compiled step is captured, the functional
        collective (:class:`_Captured`) that its graph holds."""
        return _Captured(t) if get_proxy_mode() is not None else self.all_reduce(t)

    def reduced(self, grads: Sequence[Tensor]) -> bool:
        """Whether ``grads`` are the last ``final`` gradients :meth:`grad` averaged (consumed:
        True once). A compiled step's gradients come from elsewhere and are not."""
        mark, self._mark = self._mark, {}
        return bool(mark) and len(mark) == len(grads) and all(mark.get(id(g)) is g for g in grads)

    @torch.no_grad()
    def allreduce_grads(self, params: Sequence[Tensor]) -> None:
        """The flat path on ``.grad`` in place (a missing gradient counts as zeros and is set)."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        for g, m in zip(grads, self.mean(grads)):
            g.copy_(m)

    def _layout(self, inputs: tuple[Tensor, ...]) -> Bucketer:
        key = (self.cap_bytes, *((t.shape, t.dtype, t.device) for t in inputs))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = Bucketer.of(inputs, self.cap_bytes)
        return layout


class _Flight:
    """One overlapped call in progress: the buckets' flat buffers, what each still waits
    for, and the collectives started, in bucket order."""

    def __init__(self, layout: Bucketer, inputs: tuple[Tensor, ...], all_reduce: AllReduce):
        self.layout, self.inputs, self.all_reduce = layout, inputs, all_reduce
        self.flats = [torch.empty(n, dtype=inputs[b[0]].dtype, device=inputs[b[0]].device)
                      for b, n in zip(layout.buckets, layout.sizes)]
        self.where: dict[int, tuple[int, int]] = {}     # input -> (bucket, offset)
        for k, bucket in enumerate(layout.buckets):
            offset = 0
            for i in bucket:
                self.where[i] = (k, offset)
                offset += inputs[i].numel()
        self.missing = [set(b) for b in layout.buckets]
        self.arrived: set[int] = set()
        self.works: list[Any] = []

    def hook(self, i: int) -> Callable[[Tensor], None]:
        def arrived(g: Tensor) -> None:
            k, offset = self.where[i]
            with torch.no_grad():
                self.flats[k][offset:offset + g.numel()].copy_(g.reshape(-1))
            self.missing[k].discard(i)
            self.arrived.add(i)
            self._launch_ready()
        return arrived

    def _launch_ready(self) -> None:
        while len(self.works) < len(self.flats) and not self.missing[len(self.works)]:
            self.works.append(self.all_reduce(self.flats[len(self.works)]))

    def finish(self, world: int) -> tuple[Tensor, ...]:
        for k, missing in enumerate(self.missing):
            for i in missing:
                _, offset = self.where[i]
                self.flats[k][offset:offset + self.inputs[i].numel()].zero_()
            missing.clear()
        self._launch_ready()
        for w in self.works:
            w.wait()
        out: list[Tensor] = [None] * len(self.inputs)   # type: ignore[list-item]
        for flat in self.flats:
            flat.div_(world)
        for i, t in enumerate(self.inputs):
            k, offset = self.where[i]
            out[i] = self.flats[k][offset:offset + t.numel()].view(t.shape)
        return tuple(out)


def averaged_grad(reduce: Any, outputs, inputs: Sequence[Tensor], grad_outputs=None,
                  retain_graph: bool | None = None) -> tuple[Tensor, ...]:
    """``reduce``'s average over replicas of ``autograd.grad(outputs, inputs, grad_outputs)``,
    dense: through :meth:`OverlappedSync.grad` (overlapped or flat, as it was built), or for
    any other averaging callable (a hierarchy built by hand), the gradients then ``reduce``."""
    if isinstance(reduce, OverlappedSync):
        return reduce.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph)
    g = torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph, allow_unused=True)
    return reduce(tuple(torch.zeros_like(t) if x is None else x for x, t in zip(g, inputs)))


class DelayedAllReduce:
    """A benchmark's collective: ``inner``'s, finishing no earlier than ``delay_s`` after
    the previous one finished or after its own start, whichever is later (one serial link
    that takes ``delay_s`` per message, or with ``per_mib`` per MiB sent: a link limited by
    latency, or by bandwidth). ``wait()`` sleeps the rest; compute meanwhile goes on."""

    def __init__(self, delay_s: float, inner: AllReduce = async_all_reduce, per_mib: bool = False):
        self.delay_s, self.inner, self.per_mib, self.free_at = delay_s, inner, per_mib, 0.0
        self.sent = self.calls = 0       # bytes and collectives, all calls

    def __call__(self, t: Tensor) -> Any:
        work = self.inner(t)
        size = t.numel() * t.element_size()
        self.sent += size
        self.calls += 1
        delay = self.delay_s * (size / 2**20 if self.per_mib else 1)
        self.free_at = max(time.perf_counter(), self.free_at) + delay
        return _Delayed(work, self.free_at)


@dataclass(frozen=True)
class _Delayed:
    work: Any
    done_at: float

    def wait(self) -> None:
        self.work.wait()
        left = self.done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)


def _by_dtype(tensors: list[Tensor]) -> list[list[Tensor]]:
    groups: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _unflatten_into(flat: Tensor, tensors: list[Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
