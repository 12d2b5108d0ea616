"""Where a compiled program's first outer step spends its time: each step's capture, each
graph's compile, and a cProfile of the whole step (cumulative, then internal time).

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 python3 bench/compile_profile.py programs/trilevel.mlo

A fresh Inductor cache, so that every graph is generated and built (a warm one reads them
back). cProfile's times are wall times: on a loaded machine, waits on the C++ compiler's
processes and on the processor grow with the load.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import mloc  # noqa: E402
import mloc.runtime.compiled.step as step  # noqa: E402


def main(program: str) -> None:
    torch.set_num_threads(1)
    capture = step.capture

    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        out = capture(*args, **kwargs)
        print(f"capture: {out.operations} operations, {time.perf_counter() - wall:.1f} s wall, "
              f"{time.process_time() - cpu:.1f} s CPU", flush=True)
        return out
    step.capture = timed
    session = mloc.load(program, compile="on", dtype="float64")
    profile = cProfile.Profile()
    wall, cpu = time.perf_counter(), time.process_time()
    profile.enable()
    session.program.outer_step()
    profile.disable()
    print(f"first outer step: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU "
          "(this process; the C++ compiler runs in others)")
    for report in session.program.compiling.ran():
        print(report.line())
    pstats.Stats(profile).sort_stats("cumulative").print_stats(60)
    pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "programs/trilevel.mlo")
