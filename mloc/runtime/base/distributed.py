"""Data-parallel training across processes: one context, flat-buffer collectives.

Launched by ``torchrun``, every process builds a :class:`DistContext` with
:meth:`DistContext.from_env`; with one process (or without torchrun) it is a
single-process context on which every call is a cheap no-op, so generated loops call
the same methods either way.

- :meth:`DistContext.broadcast_params` copies rank 0's tensors to every rank (call it once
  after building the models: all ranks then start identical).
- :meth:`DistContext.allreduce_grads` averages the ``.grad`` of a tuple of parameters with
  **one** collective: the gradients are flattened into one buffer, summed with
  ``all_reduce``, divided by the world size and copied back. (Tensors of different dtypes
  need one buffer, hence one collective, per dtype.) With the shards of
  :mod:`mloc.runtime.program.data` (equal batch sizes on every rank), the average of the ranks'
  mean-loss gradients is the gradient of the mean loss over the global batch. Training
  averages its gradients through :class:`mloc.runtime.base.overlap.OverlappedSync` instead
  (bucketed, during the backward; its ``overlap=False`` is this flat path).

:func:`launched_rank` says whether this process is one of several (and which), before any
process group exists; :func:`is_peer_failure` tells a collective that failed because another rank died from
a failure of this rank's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class DistContext:
    """This process's place in a data-parallel job: ``rank`` of ``world``, its ``device``,
    and the ``backend`` of the process group (``None`` for a single process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes checkpoints."""
        return self.rank == 0

    @classmethod
    def from_env(cls, timeout_s: float = 600.0, device: torch.device | None = None) -> DistContext:
        """The context torchrun describes in ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``MASTER_ADDR`` and ``MASTER_PORT``; a single-process context when ``WORLD_SIZE``
        is unset or 1. ``device``: where this process trains (:meth:`connect`). This
        module is the runtime's only reader of ``os.environ``."""
        env = os.environ
        world = int(env.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            if device is None:
                device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            return cls(device=device)
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise RuntimeError(f"WORLD_SIZE={world} but {', '.join(missing)} is not set; "
                               "launch with torchrun")
        return cls.connect(int(env["RANK"]), world, env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                           local_rank=int(env.get("LOCAL_RANK", env["RANK"])), timeout_s=timeout_s,
                           device=device)

    @classmethod
    def connect(cls, rank: int, world: int, addr: str, port: int, *, local_rank: int = 0,
                timeout_s: float = 600.0, device: torch.device | None = None) -> DistContext:
        """Join the process group at ``tcp://addr:port`` with :func:`backend_for` this
        process's ``device`` (default: ``cuda:local_rank`` when CUDA is available, else the
        CPU): nccl on a CUDA device, gloo otherwise."""
        if device is None:
            device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        backend = backend_for(device)
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        return cls(rank, world, local_rank, device, backend)

    def allreduce_grads(self, params: Sequence[Tensor]) -> None:
        """Average ``p.grad`` across processes, in place, with one ``all_reduce`` per dtype.
        A missing gradient counts as zeros (and is then set), so every rank sends the same
        buffer layout."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for group in _by_dtype([p.grad for p in params]):
            flat = _flatten(group)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(self.world)
            _unflatten_into(flat, group)

    @torch.no_grad()
    def mean(self, tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The average of ``tensors`` across processes (new tensors, one collective per
        dtype); the tensors themselves are left as they are."""
        out = [t.detach().clone() for t in tensors]
        if self.world > 1:
            for group in _by_dtype(out):
                flat = _flatten(group)
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(self.world)
                _unflatten_into(flat, group)
        return tuple(out)

    @torch.no_grad()
    def broadcast_params(self, tensors: Sequence[Tensor]) -> None:
        """Copy rank 0's ``tensors`` (parameters, buffers) to every rank, in place."""
        if self.world == 1:
            return
        for group in _by_dtype(list(tensors)):
            flat = _flatten(group)
            dist.broadcast(flat, src=0)
            _unflatten_into(flat, group)

    def barrier(self) -> None:
        """Wait for every process."""
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _by_dtype(tensors: list[Tensor]) -> list[list[Tensor]]:
    """``tensors`` grouped by dtype (usually one group), each group in its original order."""
    groups: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _flatten(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflatten_into(flat: Tensor, tensors: list[Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        with torch.no_grad():
            t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def backend_for(device: torch.device) -> str:
    """The collective backend for a process that trains on ``device``: nccl for CUDA, gloo
    for the CPU (a CPU run on a machine with GPUs stays on gloo: nccl has no CPU tensors)."""
    return "nccl" if device.type == "cuda" else "gloo"


def launched_slot() -> tuple[int, int]:
    """``(local rank, world size)`` of this process in a launched job (``LOCAL_RANK``, else
    ``RANK``; ``WORLD_SIZE``), ``(0, 1)`` for a single process: what picks its device before
    any process group exists."""
    env = os.environ
    try:
        world = int(env.get("WORLD_SIZE", "1") or 1)
        return (int(env.get("LOCAL_RANK", env.get("RANK", "0"))), world) if world > 1 else (0, 1)
    except ValueError:
        return 0, 1


def launched_rank() -> int | None:
    """``RANK`` when this process is one of several (``WORLD_SIZE`` > 1), else None."""
    env = os.environ
    try:
        return int(env["RANK"]) if int(env.get("WORLD_SIZE", "1") or 1) > 1 and "RANK" in env else None
    except ValueError:
        return None


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Socket Timeout", "Timed out waiting", "NCCL communicator was aborted")


def is_peer_failure(err: BaseException) -> bool:
    """A collective or rendezvous that failed because another process of the job died or
    stopped answering (what every surviving rank sees after one rank fails)."""
    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in _PEER_GONE)
