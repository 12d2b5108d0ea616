"""Cold wall time of `mloc check` on the example programs: one fresh process per run.

Each run starts a new interpreter (`mloc check FILE`, the console script when it is
installed, else `python -m mloc`), so the time includes Python's start-up and every import.
Disk caches stay warm as they would for a user's second invocation (bytecode, lark's table
cache); the first run after clearing lark's cache is reported separately.

    python3 bench/check_time.py [--runs 15]

Prints a Markdown table: median and min seconds per invocation, per program.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command() -> list[str]:
    script = Path(sys.executable).with_name("mloc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mloc"]


def once(cmd: list[str], program: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "check", str(program)], capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"mloc check {program} failed:\n{proc.stderr}")
    return elapsed


def clear_lark_cache() -> None:
    for f in glob.glob(os.path.join(tempfile.gettempdir(), ".lark_cache_*")):
        os.remove(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    cmd = command()
    programs = sorted((ROOT / "programs").glob("*.mlo"))
    clear_lark_cache()
    first = once(cmd, programs[0])
    print(f"command: {' '.join(Path(c).name for c in cmd)} check FILE; {args.runs} fresh processes per program")
    print(f"first run after clearing lark's table cache: {first:.3f} s\n")
    print("| program | median s | min s |\n|---|---|---|")
    medians = []
    for p in programs:
        times = [once(cmd, p) for _ in range(args.runs)]
        medians.append(statistics.median(times))
        print(f"| {p.name} | {medians[-1]:.3f} | {min(times):.3f} |")
    print(f"\nworst median: {max(medians):.3f} s (target: under 0.3 s)")


if __name__ == "__main__":
    main()
