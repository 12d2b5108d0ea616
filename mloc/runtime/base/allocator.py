"""Peak CPU memory of a piece of code, read from the allocator's own events: what a
compiled step really holds.

:class:`~mloc.runtime.base.memory.PeakMemory` counts storages at every aten operation
through a dispatch mode, so it sees eager code only: a step compiled by TorchInductor
allocates its buffers in generated code (``empty_strided_cpu``) that no dispatch mode
sees, and its fused intermediates are never allocated at all. What the CPU allocator does
is recorded by ``torch.profiler`` with ``profile_memory=True``: one ``[memory]`` event per
allocation (``Bytes`` > 0) and per free (``Bytes`` < 0) of the CPU allocator, with its
address, in time order.

:func:`allocator_peak` replays those events with :class:`PeakMemory`'s semantics: the
most bytes allocated *inside* the block and alive at one moment. An address counts from
its allocation in the block to its free; a free of memory allocated before the block (an
earlier step's batch, dropped when the new one is drawn) is not subtracted. (The events'
own running total, ``Total Allocated``, does not start at 0: the allocator's reporter
keeps every allocation made while any profiler was on, so an earlier profiled step's
survivors are in it, and their frees pull it down. Read raw it is off by that baseline.)

On eager code the two agree where both see the allocation (measured on Meta-Weight-Net:
first_order, finite_diff, sama equal to the byte); the allocator events miss a few
allocations of autograd's double backward (neumann: one 100×256 activation less than
``PeakMemory``), so a compiled peak read this way is, if anything, low.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["allocator_peak", "replay"]


def replay(events: list[dict]) -> int:
    """The peak of ``[memory]`` events (``{"ts", "args": {"Addr", "Bytes"}}``) in the
    module docstring's sense: allocations inside the block, alive at once."""
    live, peak, sizes = 0, 0, {}
    for e in sorted(events, key=lambda e: e["ts"]):
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            sizes[addr] = sizes.get(addr, 0) + nbytes
            live += nbytes
            peak = max(peak, live)
        elif addr in sizes:
            live -= sizes.pop(addr)
    return peak


def allocator_peak(fn: Callable[[], object]) -> int:
    """The peak bytes of CPU memory ``fn()`` allocates and holds at once, from the CPU
    allocator's events (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    return replay([e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0])
