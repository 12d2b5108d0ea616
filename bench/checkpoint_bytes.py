"""Bytes and save time of a gathered ``checkpoint.pt``: each parameter stored once.

For each program: ``mloc run PROGRAM --steps 3`` into a fresh folder, then the size of its
``checkpoint.pt`` against the bytes of the modules' parameters (each counted once); and,
in this process (``mloc.load``, 3 steps), the time of ``Session.save`` (the state's
snapshot, serialisation, a synced write and rename), median and minimum of ``--repeats``.
The last case is ``tests/run/small.mlo`` with its net ``--width`` wide (8·W+3 float32
parameters, momentum SGD), large enough for the save time to stand out of the noise; for it, the same state is also
written in both layouts, interleaved, ``--repeats`` times each (``save_checkpoint`` alone:
serialisation and the synced write).

The mloc it measures is the one Python imports (``PYTHONPATH``), so the former layout is
measured from a checkout of an earlier commit::

    PYTHONPATH=$PWD python bench/checkpoint_bytes.py                 # this tree
    mkdir /tmp/before && git archive 81e4a39 | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python bench/checkpoint_bytes.py          # before: params stored twice
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [("programs/data_reweighting.mlo", ()), ("programs/darts.mlo", ())]


def run_bytes(program: str, sets: tuple, out: Path) -> int:
    """`mloc run` of the mloc this process imports (not the one in the working directory)."""
    import mloc
    tree = str(Path(mloc.__file__).resolve().parent.parent)
    cmd = [sys.executable, "-m", "mloc", "run", str(ROOT / program), "--steps", "3", "--out", str(out), "--quiet",
           "--compile", "off", *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tree})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return (out / "checkpoint.pt").stat().st_size


def save_times(program: str, sets: tuple, folder: Path, repeats: int) -> tuple[int, list[float]]:
    import mloc
    session = mloc.load(ROOT / program, set=sets)
    session.run(3)
    params = {id(p): p for lv in session.program.live.values() for p in lv.module.parameters()}
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.save(folder / "c.pt")
        times.append(time.perf_counter() - t0)
    return sum(p.numel() * p.element_size() for p in params.values()), times, session


def former(state: dict) -> dict:
    """``state`` in the former layout: every ``params`` and ``module`` entry its own copy."""
    return {**state, "problems": {n: {**p, "params": [t.clone() for t in p["params"]],
                                      "module": {k: v.clone() for k, v in p["module"].items()}}
                                  for n, p in state["problems"].items()}}


def layouts(session, folder: Path, repeats: int) -> dict[str, list[float]]:
    """``save_checkpoint`` of one state in each layout, interleaved (a loaded machine's
    noise falls on both alike): seconds per write, and each file's bytes."""
    from mloc.runtime.program.checkpoint import save_checkpoint
    state = session.program.state_dict()
    forms = {"once": state, "former": former(state)}
    times: dict[str, list[float]] = {k: [] for k in forms}
    for _ in range(repeats):
        for k, payload in forms.items():
            t0 = time.perf_counter()
            save_checkpoint(folder / f"{k}.pt", payload, session.program.name)
            times[k].append(time.perf_counter() - t0)
    return {k: (t, (folder / f"{k}.pt").stat().st_size) for k, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=262144, help="small.mlo's net width (8·W+3 parameters)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import mloc
    print(f"mloc from {Path(mloc.__file__).parent}")
    cases = CASES + [("tests/run/small.mlo", (f"net.module.width={args.width}",))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (program, sets) in enumerate(cases):
            size = run_bytes(program, sets, Path(tmp) / f"run{i}")
            params, times, session = save_times(program, sets, Path(tmp), args.repeats)
            print(f"{program}{' ' + ' '.join(sets) if sets else ''}: checkpoint.pt {size:,} B, module parameters "
                  f"{params:,} B ({size / params:.2f}x); Session.save median {statistics.median(times) * 1e3:.1f} ms, "
                  f"min {min(times) * 1e3:.1f} ms")
        if importlib.util.find_spec("mloc.runtime.program.clones"):    # a tree that stores each parameter once
            for k, (t, size) in layouts(session, Path(tmp), args.repeats).items():
                print(f"  save_checkpoint, {k} layout: {size:,} B, median {statistics.median(t) * 1e3:.1f} ms, "
                      f"min {min(t) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
