"""Building a program: what generated code declares, turned into live runtime objects.

Generated code declares each problem as a :class:`ProblemSpec` and the run as a
:class:`RunConfig`; :func:`build` makes, in this order (the order fixes every random draw):

1. the seed (Python's ``random`` and torch's generators);
2. the modules, in source order, moved to the device (and cast for ``dtype`` runs), their
   children checkpointed when the planner chose to (``config.recompute``:
   :mod:`mloc.runtime.base.recompute`);
3. one :class:`~mloc.runtime.program.data.DataStream` per problem with data;
4. per problem, its trainable parameters (the module's own, or a zero ``δ`` for a problem
   with ``init``: its parameters are ``θ_init + δ``), its precision context and loss
   scaler, then, once every problem's parameters exist, its runtime
   :class:`~mloc.runtime.grad.problem.Problem` whose loss is a
   :class:`~mloc.runtime.program.binding.BoundLoss` over the modules it reads, and its optimizer
   commit (:func:`~mloc.runtime.grad.commit.optimizer_commit`);
5. the :class:`~mloc.runtime.grad.compose.Hierarchy` over the problems and edges, and the
   parameters broadcast from rank 0 (data parallelism).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from mloc.runtime.program.binding import BoundLoss, select_parameters
from mloc.runtime.grad.commit import Pipeline, optimizer_commit
from mloc.runtime.grad.compose import Edge, Hierarchy
from mloc.runtime.program.data import DataStream
from mloc.runtime.base.distributed import DistContext
from mloc.runtime.base.overlap import OverlappedSync
from mloc.runtime.program import fsdp_run as sharded
from mloc.runtime.program.strategy import apply_strategy
from mloc.runtime.optim import Optimizer
from mloc.runtime.files.options import RunConfig
from mloc.runtime.base.precision import DeviceError, autocast_factory, check_with_dtype, grad_scaler_for
from mloc.runtime.grad.problem import Problem
from mloc.runtime.program.schedules import bind
from mloc.runtime.base.recompute import recompute_children


@dataclass(frozen=True)
class ProblemSpec:
    """One problem as the generated code declares it.

    `loss(*modules, batch)` takes the modules of `reads` (the problems the loss names, in
    order). `optimizer(lr)` builds the functional optimizer; `schedule(step) -> factor`
    scales the learning rate (None: constant). `init` names the problem whose parameters
    this one starts from at every `reset`. `project(module)` runs under no_grad after
    every optimizer step (None: nothing). `reinit`: at every `reset`, start again from the
    parameters the module was built with (True) or from what `reinit(module)` sets (under
    no_grad), with a fresh optimizer state (False: no reinit).
    """

    name: str
    reads: tuple[str, ...]
    loss: Callable
    optimizer: Callable[[Any], Optimizer]
    lr: float
    trainable: tuple[str, ...] = ("*",)
    frozen: tuple[str, ...] = ()
    init: str | None = None
    clip_grad_norm: float | None = None
    precision: str | None = None
    schedule: Callable[[int], float] | None = None
    project: Callable[[nn.Module], Any] | None = None
    reinit: bool | Callable[[nn.Module], Any] = False


def usable(config, nproc: int, problems: Sequence[ProblemSpec]) -> None:
    """What a start checks before its run folder exists (a :class:`DeviceError`, exit 2):
    the device is there for ``nproc`` processes, and each problem's precision does
    something in the run's dtype (:func:`~mloc.runtime.base.precision.check_with_dtype`)."""
    resolve_device(config.device, 0, nproc)
    check_with_dtype(config.precision, config.dtype, problems)


def resolve_device(name: str, local_rank: int = 0, world: int = 1) -> torch.device:
    """The device of process ``local_rank`` of ``world`` for ``--device name``. Under data
    parallelism on CUDA each process has its own device, ``cuda:local_rank`` (nccl cannot
    put two ranks on one GPU): ``auto`` is CUDA only when there is a device for every
    process (else the CPU, with gloo), and ``cuda`` with fewer devices than processes, or
    one ``cuda:N`` for all of them, is a :class:`DeviceError` that says what to pass."""
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "auto":
        name = "cuda" if cuda_count >= world and cuda_count else "cpu"
    if world > 1 and name.startswith("cuda"):
        _check_one_device_per_process(name, world, cuda_count)
    if name == "cuda":
        name = f"cuda:{local_rank}"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise DeviceError(f"{name!r} is not a device torch knows ({str(e).splitlines()[0]})",
                          "use cpu, cuda, cuda:N, mps or auto") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"device {name} cannot train: mloc runs on cpu, cuda and mps"
                          + (" (a meta tensor holds no data)" if device.type == "meta" else ""),
                          "use cpu, cuda, cuda:N, mps or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError("device mps is not available: this torch has no Metal (MPS) support here",
                          "use --device cpu (or auto)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device (or a torch built without CUDA)"
            raise DeviceError(f"device {name} is not available: this machine has {have}",
                              "use --device cpu (or auto), or a cuda:N with N below the device count")
    return device


def _check_one_device_per_process(name: str, world: int, cuda_count: int) -> None:
    if name != "cuda":
        raise DeviceError(f"--device {name} names one GPU for all {world} processes; data "
                          f"parallelism on CUDA trains process r on cuda:r (nccl needs a GPU each)",
                          f"use --device cuda (cuda:0 … cuda:{world - 1}), or --device cpu (gloo)")
    if cuda_count < world:
        have = f"{cuda_count} CUDA device{'s' * (cuda_count != 1)}" if cuda_count else "no CUDA device"
        raise DeviceError(f"--nproc {world} on CUDA needs {world} devices, one per process; this "
                          f"machine has {have}",
                          f"use --nproc {cuda_count}{' or fewer' * (cuda_count > 1)}, or --device cpu (gloo)" if cuda_count
                          else "use --device cpu (gloo)")


@dataclass(eq=False)
class Live:
    """Runtime state of one problem."""

    spec: ProblemSpec
    module: nn.Module
    params: tuple                        # the trainable tensors (δ for an `init` problem)
    slots: list[str]
    autocast: Callable[[], Any] = None   # the problem's precision context, built once
    scaler: Any = None                   # a GradScaler for fp16 on CUDA, else None
    problem: Problem | None = None       # set once every problem's parameters exist
    commit: Callable | None = None       # commit(grads): the optimizer step, bound once
    compiled_step: Callable | None = None   # the optimizer's compiled commit, where the run compiles
    schedule: Callable | None = None     # the spec's schedule as bound to the optimizer (factor(step))
    rate: Callable | None = None         # set(value): the optimizer's scheduled rate
    drive: Callable | None = None        # set(values): the other hyperparameters a schedule drives
    pipeline: Pipeline | None = None     # the commit pipeline, built at the first step
    batch: Any = None                    # the current batch; None until the first draw
    last_loss: torch.Tensor | None = None
    steps: int = 0
    shards: tuple | None = None          # strategy fsdp: the sharded parameters (params: their local shards)


@dataclass(frozen=True)
class Built:
    """A built program: its modules, data streams, problems and hierarchy."""

    modules: dict[str, nn.Module]
    streams: dict[str, DataStream]
    live: dict[str, Live]
    hierarchy: Hierarchy
    cast: torch.dtype | None             # the floating dtype of a `dtype` run, else None
    sync: OverlappedSync                 # every average across replicas (mloc.runtime.base.overlap)
    strategy: tuple[str, str] = ("ddp", "")  # the data-parallel strategy and why (mloc.runtime.program.strategy)


def build(specs: Sequence[ProblemSpec], edges: Sequence[Edge], semantics: str,
          build_modules: Callable[[], dict], data: dict[str, Callable], config: RunConfig,
          dist: DistContext, device: torch.device, compositions: dict | None = None) -> Built:
    """Build the program (see the module docstring for the order). ``compositions``: each
    upper's hypergradient composition as the compiler planned it (``None``: the
    ``Hierarchy`` computes them with the same function)."""
    seed_everything(config.seed)
    cast = getattr(torch, config.dtype) if config.dtype else None
    modules = build_modules()
    for m in modules.values():
        m.to(device=device, dtype=cast) if cast else m.to(device)
        if config.recompute:
            recompute_children(m)
    streams = {n: DataStream(n, f, device=device, rank=dist.rank, world=dist.world)
               for n, f in data.items()}
    live = {spec.name: _live(spec, modules[spec.name], config.precision, device, cast) for spec in specs}
    if config.strategy == "fsdp" and dist.world > 1:    # rank 0's tensors, then each rank's shards of them
        dist.broadcast_params([t for lv in live.values() for t in lv.params])
        sharded.shard(live)
    for lv in live.values():    # every problem's parameters exist now: bind the losses
        lv.problem = _problem(lv, live, device, cast)
    strategy = apply_strategy(live, config.strategy, dist.rank, dist.world)
    for lv in live.values():
        lv.commit = optimizer_commit(lv)
    sync = OverlappedSync(dist.world, overlap=config.overlap != "off")
    hierarchy = Hierarchy([lv.problem for lv in live.values()], edges, semantics,
                          sync if dist.world > 1 else None, compositions)
    if strategy[0] != "fsdp":         # fsdp: broadcast before sharding
        dist.broadcast_params([t for lv in live.values() for t in lv.problem.params])
    return Built(modules, streams, live, hierarchy, cast, sync, strategy)


def _live(spec: ProblemSpec, module: nn.Module, precision: str, device: torch.device,
          cast: torch.dtype | None = None) -> Live:
    """The problem's trainable parameters (a zero δ for an `init` problem: MAML's
    θ = θ_init + δ), its learning rate and its precision."""
    slots = select_parameters(module, spec.trainable, spec.frozen)
    named = dict(module.named_parameters())
    if spec.init is None:
        params = tuple(named[s] for s in slots)
    else:
        params = tuple(torch.zeros_like(named[s]).requires_grad_() for s in slots)
    for n, t in named.items():
        t.requires_grad_(n in slots and spec.init is None)
    check_with_dtype(precision, "float64" if cast is torch.float64 else None, [spec])
    precision = spec.precision or precision
    autocast = autocast_factory(precision, device)
    scaler = grad_scaler_for(precision, device)
    return Live(spec, module, params, slots, autocast, scaler if scaler.is_enabled() else None)


def _problem(lv: Live, live: dict[str, Live], device: torch.device, cast: torch.dtype | None) -> Problem:
    """The runtime problem: its loss bound to the modules it reads, and the reads that
    implies (a read problem's `init` problem is read too: its parameters are added)."""
    reads = list(lv.spec.reads)
    extra = [live[r].spec.init for r in reads if live[r].spec.init and live[r].spec.init not in reads]
    runtime_reads = reads + list(dict.fromkeys(extra))
    offsets = {i: runtime_reads.index(live[r].spec.init) for i, r in enumerate(reads) if live[r].spec.init}
    bound = BoundLoss(lv.spec.loss, [live[r].module for r in reads], [live[r].slots for r in reads],
                      [live[r].params for r in runtime_reads], lambda: (lv.batch,),
                      offsets, module_count=len(reads))
    return Problem(lv.spec.name, lv.params, bound, tuple(runtime_reads), _optimizer(lv, device, cast))


def _optimizer(lv: Live, device: torch.device, cast: torch.dtype | None) -> Optimizer:
    """The problem's optimizer with its schedule bound to it (``lv.schedule``): its rate
    held in a 0-dim tensor set by ``lv.rate`` before each commit, in the run's dtype
    (float64 runs keep it exact), else torch's default; a torch scheduler re-created on the
    optimizer's stand-in, and the hyperparameters it drives besides the rate (OneCycleLR's
    momentum) tensors set by ``lv.drive`` (:func:`mloc.runtime.program.schedules.bind`; a
    ``ScheduleError`` if the optimizer cannot take one)."""
    optimizer = lv.spec.optimizer(lv.spec.lr)
    lv.schedule = bind(lv.spec.schedule, optimizer, lv.spec.lr, f"the optimizer of `{lv.spec.name}`")
    if lv.schedule is None:
        return optimizer
    dtype = cast or torch.get_default_dtype()
    lv.rate = optimizer.scheduled_rate(dtype, device)
    keys = getattr(lv.schedule, "keys", ())
    if keys:
        lv.drive = optimizer.drive(keys, torch.empty((), dtype=dtype, device=device))
    return optimizer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
