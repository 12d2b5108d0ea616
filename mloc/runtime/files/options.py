"""The options of a run, defined once: :class:`RunOptions`, the flags that set them, and
the :class:`RunConfig` they give. No torch here: `mloc`'s parser shows these flags.

`python train.py` parses exactly these flags (:func:`add_flags`); `mloc run` adds them to
its own parser, beside its compile-side flags (`--set`) and the ways to launch a run that
need the compiled files in the run folder (`--nproc`, `--pipeline`), which it passes on in
the same value. Either way the run starts from one :class:`RunOptions`
(:func:`mloc.runtime.processes.launch.start`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path

from mloc.runtime.files.loggers import check_available, parse
from mloc.shared.limits import flag_error
from mloc.shared.precision import PRECISIONS
from mloc.shared.strategy import CHECKPOINT_FORMS, STRATEGIES, UNAVAILABLE_HELP, unavailable



@dataclass
class RunConfig:
    """What one run trains with: the program's defaults (its train block, whose own defaults
    live in ``mloc.ir.payloads.TrainSpec``; generated code writes them all out), as the
    options change them. `dtype` None: the modules' own."""

    steps: int
    seed: int
    device: str
    precision: str
    dtype: str | None = None          # e.g. "float64" for exact checks
    compile: str = "auto"             # on, off, auto (mloc.runtime.compiled.decision)
    overlap: str = "on"               # on, off: gradient averaging overlapped (mloc.runtime.base.overlap)
    strategy: str = "auto"            # auto, ddp, zero, fsdp (mloc.shared.strategy)
    checkpoint_form: str = "gathered"  # gathered, sharded: zero's checkpoints (mloc.runtime.program.sharded)
    recompute: bool = False           # activation checkpointing, the planner's (mloc.passes.recompute)


class OptionError(Exception):
    """An option that cannot be used (exit 2), with what to do instead."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


@dataclass(frozen=True)
class RunOptions:
    """What the command line may set; None keeps the program's default (its declaration's
    `defaults`). `dtype` None trains in the modules' own dtype; `out` None is a fresh
    `runs/NAME/N`; `launched_by` is the pid of the `--nproc` launcher; `nproc` None is one
    process not launched by `mloc run`."""

    steps: int | None = None
    seed: int | None = None
    device: str | None = None
    precision: str | None = None
    dtype: str | None = None
    out: Path | None = None
    resume: Path | None = None
    overwrite: bool = False
    quiet: bool = False
    launched_by: int | None = None
    threads: int | None = None          # torch's intra-op threads; None: mloc.runtime.processes.threads decides
    logger: tuple[str, ...] | None = None   # loggers beside metrics.jsonl (mloc.runtime.files.loggers)
    nproc: int | None = None            # mloc run --nproc: data-parallel workers
    pipeline: bool = False              # mloc run --pipeline: one process per chain stage
    pipeline_delay: float = 0.0
    compile: str | None = None          # on, off, auto (mloc.runtime.compiled.decision)
    overlap: str | None = None          # on, off (mloc.runtime.base.overlap)
    strategy: str | None = None         # auto, ddp, zero, fsdp (mloc.shared.strategy)
    checkpoint_form: str | None = None  # gathered, sharded (mloc.shared.strategy.CHECKPOINT_FORMS)
    nnodes: int | None = None           # mloc run --nnodes: machines, each with its own launcher
    node_rank: int | None = None        # mloc run --node-rank: this machine's place, 0 .. nnodes - 1
    rdzv_endpoint: str | None = None    # mloc run --rdzv-endpoint HOST:PORT: where rank 0 (node 0) listens
    rdzv_timeout: float | None = None   # mloc run --rdzv-timeout SECONDS: how long joining may take (RDZV_TIMEOUT_S)
    print_torchrun: bool = False        # mloc run --print-torchrun: print each node's torchrun command, run nothing
    rerun: tuple[str, ...] = ()         # mloc run: its command but the node flags, shown to a machine that waits

    @classmethod
    def parsed(cls, args: argparse.Namespace) -> RunOptions:
        """The options of a parsed command line (:func:`add_flags`' flags; the others of
        `args` are ignored), checked: an :class:`OptionError` for one that cannot be used."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        for key in ("out", "resume"):
            given[key] = Path(given[key]) if given.get(key) is not None else None
        options = cls(**given)
        for flag in ("steps", "threads", "nproc", "nnodes"):
            value = getattr(options, flag)
            if value is not None and value < 1:
                raise OptionError(f"--{flag} must be at least 1, got {value}")
        bad = flag_error("--steps", options.steps) or flag_error("--seed", options.seed)
        if bad:                             # mloc.shared.limits: the bounds the checker applies to the file
            raise OptionError(bad)
        if options.pipeline and (options.nproc or 1) > 1:
            raise OptionError("--pipeline runs one process per stage: it does not take --nproc")
        check_nodes(options)
        if unavailable(options.strategy):
            raise OptionError(f"--strategy {options.strategy}: {unavailable(options.strategy)}", UNAVAILABLE_HELP)
        return replace(options, logger=usable_loggers(options.logger) or None)

    @property
    def multinode(self) -> bool:
        """Whether this run spans machines (`--nnodes` above 1)."""
        return (self.nnodes or 1) > 1

    def config(self, defaults: RunConfig) -> RunConfig:
        given = {k: v for k, v in (("steps", self.steps), ("seed", self.seed), ("device", self.device),
                                    ("precision", self.precision), ("compile", self.compile),
                                    ("overlap", self.overlap), ("strategy", self.strategy),
                                    ("checkpoint_form", self.checkpoint_form)) if v is not None}
        return replace(defaults, dtype=self.dtype, **given)

    def argv(self) -> list[str]:
        """The same options as `train.py` arguments (what a `--nproc` launch passes on)."""
        out = []
        for flag in ("steps", "seed", "device", "precision", "dtype", "out", "resume", "launched_by", "threads",
                     "compile", "overlap", "strategy", "checkpoint_form"):
            if getattr(self, flag) is not None:
                out += [f"--{flag.replace('_', '-')}", str(getattr(self, flag))]
        out += ["--logger", ",".join(self.logger)] if self.logger else []
        return out + (["--overwrite"] if self.overwrite else []) + (["--quiet"] if self.quiet else [])


RDZV_TIMEOUT_S = 600.0      # --rdzv-timeout's default: a machine that is late by minutes is still in time


def check_nodes(options: RunOptions) -> None:
    """An :class:`OptionError` for node flags that cannot start a multi-node run: each
    says what to pass instead (:mod:`mloc.runtime.processes.nodes` says how nodes meet).
    An explicit ``--nnodes 1`` takes ``--node-rank 0`` and an endpoint (a script written for
    M machines runs on one), and trains on this machine alone."""
    nnodes, rank, endpoint = options.nnodes, options.node_rank, options.rdzv_endpoint
    if nnodes is None:
        given = [f for f, v in (("--node-rank", rank), ("--rdzv-endpoint", endpoint),
                                ("--rdzv-timeout", options.rdzv_timeout)) if v is not None]
        if given or options.print_torchrun:
            raise OptionError(f"{' and '.join(given) or '--print-torchrun'} only applies to a run on several "
                              "machines", "add --nnodes M, the number of machines (the same on each), or drop it")
        return
    if options.pipeline and nnodes > 1:
        raise OptionError("--pipeline runs on one machine: it does not take --nnodes")
    if rank is None and nnodes > 1 and not options.print_torchrun:
        others = "1" if nnodes == 2 else f"1 .. {nnodes - 1}"
        raise OptionError(f"--nnodes {nnodes} needs --node-rank: which of the {nnodes} machines this one is",
                          f"pass --node-rank 0 on the machine that holds the run folder, {others} on the "
                          f"other{'s' * (nnodes > 2)} (the same command otherwise)")
    if rank is not None and not 0 <= rank < nnodes:
        raise OptionError(f"--node-rank must be between 0 and {nnodes - 1} (the machines are numbered from 0 "
                          f"for --nnodes {nnodes}), got {rank}", "give each machine its own number, 0 on the "
                          "machine that holds the run folder")
    if endpoint is None and (nnodes > 1 or options.print_torchrun):
        raise OptionError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, where the machines meet",
                          "pass the same HOST:PORT on every machine: an address of the --node-rank 0 machine "
                          "that the others can reach, and a free port there (e.g. --rdzv-endpoint node0:29500)")
    if endpoint is not None:
        endpoint_of(endpoint)
    if options.rdzv_timeout is not None and not 0 < options.rdzv_timeout < 1e9:
        raise OptionError(f"--rdzv-timeout must be a number of seconds above 0, got {options.rdzv_timeout:g}",
                          f"e.g. --rdzv-timeout 1800 to give the machines half an hour to join (default "
                          f"{RDZV_TIMEOUT_S:g})")


def endpoint_of(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[IPv6]:PORT`` too) as (host, port); an :class:`OptionError` otherwise."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise OptionError(f"--rdzv-endpoint must be HOST:PORT with a port from 1 to 65535, got {text!r}",
                          "e.g. --rdzv-endpoint node0:29500 (or 127.0.0.1:29500 to try it on one machine)")
    return host, int(port)


def usable_loggers(values) -> tuple[str, ...]:
    """`--logger` values as names, each one's package installed (a :class:`LoggerError`,
    exit 2, says what to install)."""
    names = parse(values)
    check_available(names)
    return names


def add_flags(p: argparse.ArgumentParser, defaults: RunConfig | None = None) -> None:
    """The run's flags on parser `p`; `defaults` (train.py's) are shown in the help, else
    "the train block's"."""
    said = (lambda key: f"default {getattr(defaults, key)}") if defaults else (lambda key: "default: the train block's")
    p.add_argument("--steps", type=int, help=f"outer (top-level) steps; {said('steps')}")
    p.add_argument("--seed", type=int, help=f"random seed; {said('seed')}")
    p.add_argument("--device", help=f"cpu, cuda, cuda:N or auto; {said('device')}")
    p.add_argument("--precision", choices=PRECISIONS, help=f"autocast precision; {said('precision')}")
    p.add_argument("--dtype", choices=("float32", "float64"),
                   help="cast the modules, every floating batch and the evaluations' data arguments to this "
                        "dtype (float64 for exact comparisons); default: as the program builds them")
    p.add_argument("--compile", choices=("auto", "on", "off"),
                   help="compile the training steps with torch.compile (TorchInductor): on, off, or auto (the "
                        "default: after 5 eager steps, compile when the steps left are expected to save more time "
                        "than compiling costs; the run says which and why)")
    p.add_argument("--overlap", choices=("on", "off"),
                   help="under --nproc: average gradients across processes in buckets while the backward runs (on, "
                        "the default) or after it, in one flat collective (off); the numbers are the same")
    p.add_argument("--strategy", choices=STRATEGIES,
                   help="under --nproc: ddp (every rank holds the optimizer state), zero (each rank keeps and updates "
                        "its shard of it), fsdp (each rank holds a shard of the parameters too: plain steps and the first-order "
                        "methods of two-level programs; `mloc explain E221`), or auto (decided from the model's size and "
                        "the world size); "
                        f"{said('strategy')}")
    p.add_argument("--checkpoint-form", choices=CHECKPOINT_FORMS,
                   help="under --strategy zero: gathered (one checkpoint.pt holding the whole state, as ddp writes "
                        "it) or sharded (each rank writes its optimizer-state shard beside checkpoint.pt, which "
                        f"holds the rest and the shards' manifest); either resumes into any --nproc and strategy; "
                        f"{said('checkpoint_form')}")
    p.add_argument("--out", metavar="DIR",
                   help="where config.json, metrics.jsonl and checkpoint.pt go (and, under mloc run, train.py); "
                        "it must not hold another run (default: a fresh runs/PROGRAM/N, linked from "
                        "runs/PROGRAM/latest)")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR (from DIR/checkpoint.pt), in DIR itself unless --out names "
                        "another folder, which must hold no run and receives a copy; the run's --steps, "
                        "--device and --precision (under mloc run its --set and --nproc too) apply unless "
                        "given (a change is shown), and its --seed and --dtype cannot change")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an --out folder that already holds a run (its checkpoint, metrics and "
                        "config are deleted)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch's CPU threads for this run (per process under --nproc); default: 1 for a small "
                        "program or on a busy machine, else the idle cores (the first line says which and why)")
    p.add_argument("--logger", action="append", metavar="NAME",
                   help="also log to csv (metrics.csv), tensorboard (tb/, needs mloc[tensorboard]) or wandb "
                        "(needs mloc[wandb]; WANDB_MODE=offline works without a network); a comma list or repeated")


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """`mloc run`'s flags that start processes: `--nproc` on one machine, and the machines
    of a multi-node run (:mod:`mloc.runtime.processes.nodes`)."""
    p.add_argument("--nproc", type=int, metavar="N",
                   help="data-parallel processes on this machine (gloo or nccl), started and watched by mloc; rank 0 "
                        "shows its progress (default 1)")
    p.add_argument("--nnodes", type=int, metavar="M",
                   help="machines in the run (default 1): run the same command on each, with its own --node-rank "
                        "and the same --rdzv-endpoint; the run has M x N ranks")
    p.add_argument("--node-rank", type=int, metavar="R",
                   help="with --nnodes: this machine's number, 0 .. M-1; node 0 holds the run folder, logs and "
                        "writes the checkpoints, the others write nothing there")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="with --nnodes: where the machines meet, the same on each: an address of node 0 the "
                        "others can reach and a free port there (rank 0 listens on it)")
    p.add_argument("--rdzv-timeout", type=float, metavar="SECONDS",
                   help=f"with --nnodes: how long the machines' processes wait for each other to join (default "
                        f"{RDZV_TIMEOUT_S:g}); a machine still waiting after 15 s says so, with each machine's "
                        "command, and one that gives up stops with exit 2 saying what to check. It bounds joining "
                        "only: the collectives keep their own timeout")
    p.add_argument("--print-torchrun", action="store_true",
                   help="with --nnodes: print the commands that run this program under torchrun instead of mloc "
                        "(mloc compile, then one torchrun per machine, the ranks numbered alike); compiles and "
                        "trains nothing")
