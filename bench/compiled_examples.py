"""Each example program compiled (`--compile on`) against its eager steps, a few steps each.

    python3 bench/compiled_examples.py                      # every programs/*.mlo, 4 steps, float64
    python3 bench/compiled_examples.py maml.mlo --steps 10

Each outer step runs eagerly and compiled from the same state (the eager session's
`state_dict`, random generators included), so what is printed is the compiled step's own
difference: the largest relative difference of any parameter after a step (max |a − b| /
max |a| per tensor), the step's graphs and recompiles, and the seconds spent compiling (the
first steps). `tests/compiled/test_compiled_examples.py` (slow tier) asserts the same over
100 steps within its bounds; this is the quick look, and the figures of docs/runtime.md's
"Compiled steps".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mloc  # noqa: E402


def worst_difference(eager, compiled) -> float:
    worst = 0.0
    for name, lv in eager.program.live.items():
        for a, b in zip(lv.problem.params, compiled.program.live[name].problem.params):
            worst = max(worst, ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item())
    return worst


def compare(path: Path, steps: int, dtype: str) -> str:
    start = time.perf_counter()
    eager, compiled = (mloc.load(path, dtype=dtype, compile=mode) for mode in ("off", "on"))
    worst = 0.0
    for _ in range(steps):
        state = eager.program.state_dict()
        for session in (eager, compiled):
            session.program.load_state_dict(state)
            session.step()
        worst = max(worst, worst_difference(eager, compiled))
    reports = compiled.program.compiling.ran()
    eager_steps = [r.line() for r in reports if not r.compiled]
    return (f"| {path.stem} | {worst:.2g} | {steps} | {sum(r.graphs for r in reports)} | "
            f"{sum(r.recompiles for r in reports)} | {sum(r.seconds for r in reports):.0f} | "
            f"{time.perf_counter() - start:.0f} | {'; '.join(eager_steps) or 'none'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help="files of programs/ (default: every *.mlo)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    args = ap.parse_args()
    names = args.programs or sorted(p.name for p in (ROOT / "programs").glob("*.mlo"))
    print("| example | worst relative difference | steps | graphs | recompiles | compile s | wall s | eager steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        print(compare(ROOT / "programs" / name, args.steps, args.dtype), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
