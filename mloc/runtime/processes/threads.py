"""How many CPU threads a run gives torch when the command does not say (`--threads N`).

torch's own default is one intra-op thread per core. Two things make that a poor default
for mloc's programs, which are often small:

- **A busy machine.** An op split over threads waits, at its end, for the slowest one; a
  thread the scheduler has taken off its core (another process wanted it) holds all the
  others up, and OpenMP's waiting threads spin meanwhile, taking cores from the one they
  wait for. A small DARTS program ran at 2.7 steps/s with torch's default (2 threads) on a
  busy 2-core machine, and at 123 steps/s with `--threads 1` (issue 22).
- **A small program.** torch splits an elementwise op over threads only above
  ``GRAIN_SIZE`` = 32768 elements (``at::internal::GRAIN_SIZE``), so the parameter updates
  of a program whose every parameter tensor is smaller than that run on one thread anyway,
  and its small matrix products gain less from a second thread than the synchronisation
  of each op costs.

The rule (:func:`choose`, a pure function of what it is given, first match wins):

1. ``OMP_NUM_THREADS`` is set: torch's (it reads the variable), the environment's choice;
2. the program's largest parameter tensor has fewer than ``GRAIN_SIZE`` elements: 1;
3. the cores the process may run on (``os.sched_getaffinity``) minus the machine's load
   (the 1-minute load average, ``os.getloadavg``), rounded: the idle cores. Fewer than 2
   idle (on a machine with more than one core) is 1 thread; else one thread per idle core,
   divided among the ``--nproc`` processes, at least 1.

`--threads N` always wins. Each process decides once, after building the program (the
largest parameter tensor is measured on its modules), before its first step; the banner
shows the number and the reason, and `config.json` records both (``threads``,
``threads_reason``). The choice changes how fast a run goes, not what it computes, except
in the last bits of a float reduction that torch splits over threads: a bitwise comparison
of two runs wants the same thread count (`--threads 1`, or ``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GRAIN_SIZE = 32768
"""torch's at::internal::GRAIN_SIZE: the fewest elements an op splits over threads."""


@dataclass(frozen=True)
class Threads:
    """A thread count and why; ``reason`` is None when the command gave it (``--threads``)."""

    count: int
    reason: str | None = None


def choose(cores: int, load: float | None, largest: int | None, nproc: int = 1,
           env: str | None = None, torch_default: int | None = None) -> Threads:
    """The rule of the module docstring. ``cores``: the cores this process may use; ``load``:
    the 1-minute load average (None where unknown); ``largest``: the elements of the largest
    parameter tensor (None where unknown); ``env``: ``OMP_NUM_THREADS``, if set;
    ``torch_default``: what torch chose from it."""
    cores, nproc = max(1, cores), max(1, nproc)
    if env is not None and env.strip():
        return Threads(torch_default or max(1, _int(env) or 1), f"OMP_NUM_THREADS={env.strip()}")
    if largest is not None and largest < GRAIN_SIZE:
        return Threads(1, f"a small program: its largest parameter tensor has {largest} elements, under "
                          f"torch's {GRAIN_SIZE} per thread")
    if load is None:
        return Threads(max(1, cores // nproc), f"{cores} core{'s' * (cores != 1)}"
                       + (f" for {nproc} processes" if nproc > 1 else "") + ", the load unknown")
    idle = max(0, int(cores - load + 0.5))
    if idle < 2 and cores > 1:
        return Threads(1, f"the machine is busy: load {load:.1f} on {cores} cores")
    per = f", divided among {nproc} processes" if nproc > 1 else ""
    return Threads(max(1, idle // nproc), f"{idle} of {cores} core{'s' * (cores != 1)} idle (load {load:.1f}){per}")


def machine() -> tuple[int, float | None]:
    """(the cores this process may run on, the 1-minute load average or None)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return cores, load


def largest_parameter(modules) -> int | None:
    """The elements of the largest parameter tensor of ``modules`` (torch modules)."""
    sizes = [p.numel() for m in modules for p in m.parameters()]
    return max(sizes) if sizes else None


def decide(modules, requested: int | None, nproc: int = 1) -> Threads:
    """Set torch's intra-op threads for a run of ``modules``: ``requested`` (``--threads``)
    when given, else :func:`choose` on this machine now; returns what was set."""
    import torch
    if requested is not None:
        torch.set_num_threads(requested)
        return Threads(requested)
    cores, load = machine()
    chosen = choose(cores, load, largest_parameter(modules), nproc, os.environ.get("OMP_NUM_THREADS"),
                    torch.get_num_threads())
    torch.set_num_threads(chosen.count)
    return chosen


def _int(text: str) -> int | None:
    try:
        return int(text.split(",")[0])
    except ValueError:
        return None
