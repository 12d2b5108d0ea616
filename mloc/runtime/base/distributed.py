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

Where a process learns its place (:func:`launch_env`): torchrun's variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), set by torchrun, by
``mloc run --nproc/--nnodes`` and by hand; else a task of a SLURM job step started by
``srun`` (``SLURM_PROCID`` the rank, ``SLURM_STEP_NUM_TASKS`` the world, ``SLURM_LOCALID``
the local rank, with ``MASTER_ADDR`` and ``MASTER_PORT`` exported by the job script). Only a
step's task count says that srun launched this process: a batch script itself also sees
``SLURM_PROCID=0`` and the allocation's ``SLURM_NTASKS``, and a ``python train.py`` run
there directly is one process, not rank 0 of a job waiting for the others.

:func:`launched_rank` says whether this process is one of several (and which), before any
process group exists; :func:`is_peer_failure` tells a collective that failed because another rank died from
a failure of this rank's own.

**One process group per process.** The first program a process builds under a launch
joins the group; a later one (``mloc.load`` twice in one script under torchrun, a sweep of
sessions) uses the same group, and so does a program built where the user's own code
already called ``init_process_group`` with the same rank and world. The group is left when
the process exits (if mloc joined it), not when a program closes: a second
``init_process_group`` on the launch's ``MASTER_PORT`` races the first one's TCP store (a
rank that gets there first connects to the store being torn down, and gloo's full mesh
then fails with "Connection refused").
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Sequence

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
        is unset or 1. ``device``: where this process trains (:meth:`connect`). Under
        ``mloc run --nnodes``, its launcher also says how long joining may take
        (:data:`JOIN_TIMEOUT_VAR`) and where to say how it went (:data:`JOIN_FILE_VAR`). This
        module is the runtime's only reader of ``os.environ``."""
        env = launch_env(os.environ)
        world = _number(env, "WORLD_SIZE", "1")
        if world <= 1:
            if device is None:
                device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            return cls(device=device)
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise LaunchError(f"WORLD_SIZE={world} but {', '.join(missing)} is not set: this process cannot find "
                              "the others", _LAUNCH_HELP)
        join = Join(_number(os.environ, JOIN_TIMEOUT_VAR, str(timeout_s), float, _JOIN_TIMEOUT_HELP),
                    os.environ.get(JOIN_FILE_VAR))
        rank = _number(env, "RANK")
        return cls.connect(rank, world, env["MASTER_ADDR"], _number(env, "MASTER_PORT"),
                           local_rank=_number(env, "LOCAL_RANK", str(rank)), timeout_s=timeout_s,
                           device=device, join=join)

    @classmethod
    def connect(cls, rank: int, world: int, addr: str, port: int, *, local_rank: int = 0,
                timeout_s: float = 600.0, device: torch.device | None = None,
                join: Join | None = None) -> DistContext:
        """Join the process group at ``tcp://addr:port`` with :func:`backend_for` this
        process's ``device`` (default: ``cuda:local_rank`` when CUDA is available, else the
        CPU): nccl on a CUDA device, gloo otherwise. ``timeout_s`` bounds each collective,
        ``join`` (default: ``timeout_s`` and no file) the joining: see :class:`Join`."""
        if device is None:
            device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        backend = backend_for(device)
        if backend == "nccl":
            torch.cuda.set_device(device)
        if dist.is_initialized():       # a program before this one, or the user's own code
            _same_group(rank, world, backend)
        else:
            (join or Join(timeout_s)).init(backend, addr, port, rank, world, timeout_s)
            atexit.register(_leave)
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

    def check_same(self, what: Mapping[str, object]) -> None:
        """Raise :class:`LaunchError` on every rank unless every rank passes the same
        ``what`` (the program and the options it trains with). Ranks started by separate
        commands (the machines of ``mloc run --nnodes``, torchrun's, srun's) that train a
        different number of steps or another program would wait on each other's
        collectives, or average unrelated gradients. One ``all_gather_object`` at start."""
        if self.world == 1:
            return
        seen: list = [None] * self.world
        dist.all_gather_object(seen, dict(what))
        other = next((r for r, w in enumerate(seen) if w != seen[0]), None)
        if other is None:
            return
        keys = sorted(k for k in {*seen[0], *seen[other]} if seen[0].get(k) != seen[other].get(k))
        said = "; ".join(f"{k} {seen[0].get(k)!r} on rank 0, {seen[other].get(k)!r} on rank {other}" for k in keys)
        raise LaunchError(f"the ranks of this run were not started alike: {said}",
                          "start every machine with the same command (the same program, --set, --steps, --seed, "
                          "--precision, --dtype, --compile and --resume), only --node-rank differing")

    def barrier(self) -> None:
        """Wait for every process."""
        if self.world > 1:
            dist.barrier()


JOIN_TIMEOUT_VAR = "MLOC_RDZV_TIMEOUT"   # set by `mloc run --nnodes`: the seconds its workers may take to join
JOIN_FILE_VAR = "MLOC_JOIN_FILE"        # set by `mloc run --nnodes`: where a worker says how its joining went


@dataclass(frozen=True)
class Join:
    """How a process joins its group: within ``timeout_s`` seconds, saying how it went in
    ``file`` (None: nowhere) for the launcher that watches it
    (:mod:`mloc.runtime.processes.joining`): ``joining``, then ``joined``, or ``failed``
    and torch's message.

    **What the timeout governs.** torch has one timeout per process group
    (``init_process_group(timeout=)``): the rendezvous waits that long for every rank
    (rank 0's store for the others to connect: "Timed out after 5 seconds waiting for
    clients. 1/2 clients joined."; the others to reach rank 0), and so does every
    collective afterwards. mloc wants joining and collectives bounded apart (a machine
    started late is not a collective that hangs), so it meets the others itself, as torch's
    ``tcp://`` rendezvous does: a ``TCPStore`` at the endpoint (rank 0's listens and waits
    for every rank; the others connect), made with ``timeout_s``, then given the
    collectives' timeout, and the group built on it with the collectives' timeout:
    ``timeout_s`` governs joining only, and torch's own messages are unchanged."""

    timeout_s: float
    file: str | None = None

    def init(self, backend: str, addr: str, port: int, rank: int, world: int, collectives_s: float) -> None:
        """``init_process_group`` at ``tcp://addr:port`` within this join's timeout. A failure
        to join is a :class:`JoinError` (exit 2); under a launcher that watches (``file``
        set), torch's own error, the launcher reporting it once for the machine."""
        self._say("joining")
        try:
            with self._quiet():
                store = dist.TCPStore(addr, port, world, rank == 0, timedelta(seconds=self.timeout_s),
                                      wait_for_workers=True)
                store.set_timeout(timedelta(seconds=collectives_s))
                dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                        timeout=timedelta(seconds=collectives_s))
        except Exception as err:
            if not is_peer_failure(err):
                raise
            self._say(f"failed\n{err}")
            if self.file:
                raise
            said = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise JoinError(f"rank {rank} of {world} could not join the others at {addr}:{port} (given "
                            f"{self.timeout_s:g} s to): {said}",
                            "start every process of the job with the same MASTER_ADDR and MASTER_PORT (an address "
                            "of rank 0's machine that every machine reaches, a port free there)") from err
        self._say("joined")

    @contextmanager
    def _quiet(self):
        """Under a launcher that watches (``file`` set), while this process joins: its
        stderr (fd 2) goes to ``FILE.log`` (torch's c10d logs every failed try to reach
        the endpoint with a C++ stack, which would reach the terminal through the
        launcher's live copy of the first worker's stderr, before the launcher's own
        report), and SIGINT, the launcher's Ctrl-C, has its default action: torch waits in
        C++, where no Python handler runs, and there is nothing to save yet."""
        if not self.file:
            yield
            return
        sys.stderr.flush()
        saved, log = os.dup(2), os.open(f"{self.file}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        main = threading.current_thread() is threading.main_thread()
        handler = signal.signal(signal.SIGINT, signal.SIG_DFL) if main else None
        os.dup2(log, 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.close(log)
            if handler is not None:
                signal.signal(signal.SIGINT, handler)

    def _say(self, text: str) -> None:
        if self.file:
            part = f"{self.file}.part"
            with open(part, "w", encoding="utf-8") as f:
                f.write(text + "\n")
            os.replace(part, self.file)


def _same_group(rank: int, world: int, backend: str) -> None:
    """The process group this process is already in is the one the launch describes."""
    have = (dist.get_rank(), dist.get_world_size(), dist.get_backend())
    if have != (rank, world, backend):
        raise LaunchError(f"this process is already in a process group as rank {have[0]} of {have[1]} "
                          f"({have[2]}), but its launch says rank {rank} of {world} ({backend})",
                          "build every program of a process under the same launch, or call "
                          "torch.distributed.destroy_process_group() before a different one")


def _leave() -> None:
    """At exit: leave the process group mloc joined (torch warns about one never left)."""
    if dist.is_initialized():
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


class LaunchError(RuntimeError):
    """A launch whose variables do not say how to reach the other processes (exit 2)."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


class JoinError(LaunchError):
    """The processes of a job did not all join its group in time (exit 2)."""


_LAUNCH_HELP = ("launch with torchrun (it sets them), `mloc run --nproc N [--nnodes M ...]`, or under SLURM srun "
                "with MASTER_ADDR (e.g. the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`) and "
                "MASTER_PORT exported in the job script")

_JOIN_TIMEOUT_HELP = f"set {JOIN_TIMEOUT_VAR} to the seconds joining may take (e.g. 600), or unset it"

_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _number(env: Mapping[str, str], name: str, default: str | None = None, kind=int, fix: str = _LAUNCH_HELP):
    """The launch variable ``name`` of ``env`` as a number (``default`` when unset or
    empty); a value that is not one is the launch's mistake (:class:`LaunchError`, exit 2)."""
    text = env.get(name) or default
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise LaunchError(f"the environment variable {name}={text!r} is not a{'n integer' if kind is int else ' number'}",
                          fix) from None
    if kind is float and not value > 0:
        raise LaunchError(f"the environment variable {name}={text!r} is not a number of seconds above 0", fix)
    return value


def launch_env(env: Mapping[str, str]) -> dict[str, str]:
    """This process's place as torchrun's variables (those of ``_TORCHRUN`` that ``env``
    gives): torchrun's own when ``WORLD_SIZE`` is set, else a srun task's mapped from
    SLURM's (see the module docstring), else none (one process). Pure: the tests call it
    with dictionaries."""
    if "WORLD_SIZE" in env or "SLURM_STEP_NUM_TASKS" not in env or "SLURM_PROCID" not in env:
        return {k: env[k] for k in _TORCHRUN if k in env}
    mapped = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
              "LOCAL_RANK": env.get("SLURM_LOCALID", "0")}
    if env.get("SLURM_NTASKS_PER_NODE", "").isdigit():      # set by --ntasks-per-node
        mapped["LOCAL_WORLD_SIZE"] = env["SLURM_NTASKS_PER_NODE"]
    return {**mapped, **{k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in env}}


def launched_slot() -> tuple[int, int]:
    """``(local rank, world size)`` of this process in a launched job (``LOCAL_RANK``, else
    ``RANK``; ``WORLD_SIZE``), ``(0, 1)`` for a single process: what picks its device before
    any process group exists."""
    env = launch_env(os.environ)
    try:
        world = int(env.get("WORLD_SIZE", "1") or 1)
        return (int(env.get("LOCAL_RANK", env.get("RANK", "0"))), world) if world > 1 else (0, 1)
    except ValueError:
        return 0, 1


def local_processes(world: int) -> int:
    """How many processes of this job share this machine (``LOCAL_WORLD_SIZE``; ``world``
    when the launch does not say): what divides its cores among them."""
    try:
        return max(1, int(launch_env(os.environ).get("LOCAL_WORLD_SIZE", world)))
    except ValueError:
        return world


def launched_rank() -> int | None:
    """``RANK`` when this process is one of several (``WORLD_SIZE`` > 1), else None."""
    env = launch_env(os.environ)
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
