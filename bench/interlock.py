"""Interlocking backpropagation on programs/interlock4.mlo (4 stages, scikit-learn digits):
accuracy per policy, per-stage timings and the pipeline period model, and the measured
period of the real pipeline against it.

    python bench/interlock.py [--steps 300] [--seeds 0 1 2] [--delay 0.05] [--pipe-steps 30]
                              [--json bench/interlock.json]

1. Accuracy: local (n=1), 2-wise, 3-wise and global (n=4) trained `--steps` steps per
   seed in one process (the simulation); test accuracy on the 400 held-out digits.
2. Per-stage timings, in one process with one thread, median of 200 repetitions at the
   program's batch size: F (the stage's forward), B (its parameters' backward), B_in (the
   signal at its input only), A (its head: loss and backward). The predicted steady period
   of each policy, P(n) = nF + (n-1)B_in + B + A + 2(n-1)c, with each term the slowest
   stage's and c the measured hop latency.
3. The real pipeline (`mloc run --pipeline`, one process per stage, gloo on 127.0.0.1,
   one thread each) for each policy with an injected delay d per stage (sleep d per F and
   B_in, 2d per B) that emulates four devices on two cores: its measured steady period
   (median step time of worker 0 after 3 steps) against P(n) with F+d, B_in+d, B+2d.

Every worker and this process run with one thread; numbers on a shared machine move with
its load (the JSON records the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mloc  # noqa: E402
from mloc.cli.train import write_outputs  # noqa: E402
from mloc.codegen.compile import compile_program  # noqa: E402
from mloc.runtime.grad import interlock as il  # noqa: E402
from mloc.runtime.processes import pipeline  # noqa: E402

PROGRAM = ROOT / "programs" / "interlock4.mlo"
POLICIES = {1: "local", 2: "2-wise", 3: "3-wise", 4: "global"}


def variant(n: int, folder: Path) -> Path:
    """programs/interlock4.mlo with `interlock = n`, beside a copy of its Python module."""
    text = PROGRAM.read_text().replace("{ interlock = 2 }", f"{{ interlock = {n} }}")
    path = folder / f"interlock4_n{n}.mlo"
    for name in ("deep_supervision.py", "synthetic.py"):
        (folder / name).write_text((ROOT / "programs" / name).read_text())
    path.write_text(text)
    return path


def accuracy(path: Path, seed: int, steps: int) -> float:
    prog = mloc.load(path, seed=seed)
    prog.run(steps)
    return next(iter(prog.evaluate().values()))      # the program's one evaluation


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stage_timings(path: Path, reps: int = 200) -> list[dict]:
    """F, B, B_in, A per stage (seconds), with the program's modules and first batch."""
    prog = mloc.load(path)
    program = prog.program
    chain = program.chains["stage1"]
    stages = il.stages_of(chain, program.live)
    modules, names = [s.module for s in stages], list(chain.stages)
    program.draw("stage1")
    for n in names[1:]:
        program.live[n].batch = program.live["stage1"].batch
    out, features = [], None
    for j, s in enumerate(stages):
        fw = il.forward_stage(s.loss, modules, j, features, True, names)
        f = _median_time(lambda: il.forward_stage(s.loss, modules, j, features, False, names), reps)
        fh = _median_time(lambda: il.forward_stage(s.loss, modules, j, features, True, names), reps)
        g = torch.ones_like(fw.out) / fw.out.numel()

        def head():
            il.head_backward(il.forward_stage(s.loss, modules, j, features, True, names), s.params, True)
        a = _median_time(head, reps) - f
        b = _median_time(lambda: il.stage_backward(fw, s.params, g, True, False), reps)
        b_in = _median_time(lambda: il.stage_backward(fw, s.params, g, False, True), reps) if j else 0.0
        out.append({"stage": names[j], "F": f, "B": b, "B_in": b_in, "A": a, "F_with_head": fh})
        features = fw.out.detach()
    return out


def predicted(t: list[dict], n: int, c: float, d: float = 0.0) -> float:
    """P(n) = nF + (n-1)B_in + B + A + 2(n-1)c, each term the slowest stage's, with an
    injected delay d added to F and B_in and 2d to B."""
    F = max(s["F"] for s in t) + d
    B_in = max(s["B_in"] for s in t) + d
    B = max(s["B"] for s in t) + 2 * d
    A = max(s["A"] for s in t)
    return n * F + (n - 1) * B_in + B + A + 2 * (n - 1) * c


def steady_busy_idle(rank: dict, skip: int = 3) -> tuple[float, float]:
    """A worker's mean busy and idle seconds per step after ``skip`` steps."""
    walls, idles = rank["step_wall_s"][skip:], rank["step_idle_s"][skip:]
    return (sum(walls) - sum(idles)) / len(walls), sum(idles) / len(walls)


def measure_pipeline(path: Path, folder: Path, steps: int, delay: float) -> dict:
    build = folder / f"build_{path.stem}"
    compiled = compile_program(str(path), out_dir=build)
    train = write_outputs(compiled, build)
    return pipeline.launch(train, 4, steps, folder / f"pipe_{path.stem}", delay=delay, timeout=600)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--pipe-steps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-pipeline", action="store_true", help="accuracy only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = {"load_before": os.getloadavg(), "steps": args.steps, "seeds": args.seeds, "delay_s": args.delay,
              "pipe_steps": args.pipe_steps}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = {n: variant(n, folder) for n in POLICIES}
        if not args.skip_accuracy:
            acc = {POLICIES[n]: [accuracy(paths[n], s, args.steps) for s in args.seeds] for n in POLICIES}
            result["accuracy"] = acc
            print("| policy | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean |")
            print("|---|" + "---|" * (len(args.seeds) + 1))
            for name, a in acc.items():
                print(f"| {name} | " + " | ".join(f"{x:.4f}" for x in a) + f" | {statistics.mean(a):.4f} |")
        if args.skip_pipeline:
            paths = {}
        t = stage_timings(paths[2]) if paths else []
        result["timings"] = t
        print("\n| stage | F (ms) | B (ms) | B_in (ms) | A (ms) |\n|---|---|---|---|---|")
        for s in t:
            print(f"| {s['stage']} | {s['F'] * 1e3:.3f} | {s['B'] * 1e3:.3f} | {s['B_in'] * 1e3:.3f} | {s['A'] * 1e3:.3f} |")
        runs = {}
        for n in paths:
            runs[n] = measure_pipeline(paths[n], folder, args.pipe_steps, args.delay)
        c = statistics.median(r["ranks"][0]["hop_latency_s"] for r in runs.values()) if runs else 0.0
        result["hop_latency_s"] = c
        rows = []
        print(f"\nhop latency c = {c * 1e3:.3f} ms; injected delay d = {args.delay * 1e3:.0f} ms per F and B_in, "
              f"{2 * args.delay * 1e3:.0f} ms per B")
        print("| policy | P(n), no delay (ms) | P(n) with delay (ms) | measured period (ms) | measured / predicted "
              "| busy per step, workers 1..4 (ms) | idle per step, workers 1..4 (ms) |\n|---|---|---|---|---|---|---|")
        for n, r in runs.items():
            p0, pd, m = predicted(t, n, c), predicted(t, n, c, args.delay), r["period_s"]
            busy, idle = zip(*(steady_busy_idle(x) for x in r["ranks"]))
            rows.append({"policy": POLICIES[n], "n": n, "predicted_s": p0, "predicted_with_delay_s": pd,
                         "measured_period_s": m, "busy_per_step_s": busy, "idle_per_step_s": idle,
                         "busy_total_s": [x["busy_s"] for x in r["ranks"]],
                         "idle_total_s": [x["idle_s"] for x in r["ranks"]]})
            print(f"| {POLICIES[n]} | {p0 * 1e3:.2f} | {pd * 1e3:.1f} | {m * 1e3:.1f} | {m / pd:.2f} | "
                  + " / ".join(f"{x * 1e3:.0f}" for x in busy) + " | "
                  + " / ".join(f"{x * 1e3:.0f}" for x in idle) + " |")
        result["pipeline"] = rows
    result["load_after"] = os.getloadavg()
    print(f"\nload average before {result['load_before'][0]:.1f}, after {result['load_after'][0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
