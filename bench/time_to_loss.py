"""Benchmark: when compiling pays. Wall time to each step and each loss of a whole `mloc run`,
compiled against eager, compile time included.

Each run is a fresh `python -m mloc run PROGRAM --compile MODE --threads 1 --set
train.log_every=10` process (default `programs/data_reweighting.mlo`, its 3000 steps,
evaluation every 500 and checkpoints every 1000 included, as a user runs it). The clock
starts just before the process is launched, so a step's wall time includes Python's
start-up, imports, `mloc`'s compiler (parse, trace, plan, code generation), building the
program, the first step's capture and TorchInductor compile, evaluations and checkpoints:
what a user waits for. The step times come from the `time` of `metrics.jsonl`'s records
(one every 10 steps), the compile seconds from `config.json`'s `compiled` reports.

Modes, each run `--reps` times in a fresh random order per repetition:

- **eager**: `--compile off`;
- **on, cold**: `--compile on` with an empty TorchInductor cache (`TORCHINDUCTOR_CACHE_DIR`
  a fresh directory): a first run of the program on this machine;
- **on, warm**: `--compile on` again with the cache the cold run of the same repetition
  filled: a second run of the same program;
- **auto**: `--compile auto` (the default) with an empty cache: 5 eager steps after the
  first, then compiled if the rule of `mloc/runtime/compiled/decision.py` expects it to pay.

On a shared machine wall time includes the other jobs' share of the CPUs; the total CPU
seconds of each run (`getrusage` of the finished process and the compiler's worker
processes) are given beside it.

Reported: the median wall seconds at the chosen steps and each mode's training loss there
(the classifier's mean weighted loss over the last 10 steps, and the weight net's clean
loss), the crossover (the first logged step from which a compiled mode's median wall time
stays below eager's; and where it would, were both to go on at the pace of their last
half), the time to reach given classifier losses (the first logged step at
or below each), and the seconds in the compiler.

    python3 bench/time_to_loss.py [--program programs/data_reweighting.mlo] [--steps 3000]
                                  [--reps 3] [--at 100,500,1000,3000] [--losses 0.1,0.03,0.01]
                                  [--modes eager,on-cold,on-warm,auto]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"eager": ("off", "none"), "on-cold": ("on", "cold"), "on-warm": ("on", "warm"), "auto": ("auto", "cold")}
LOG_EVERY = 10


def run_once(program: Path, steps: int, compile: str, out: Path, cache: Path, extra: list[str]) -> dict:
    """One `mloc run` process; its records as {step: (wall s, classifier loss, weight_net loss)},
    its compile reports and its total wall seconds."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "mloc", "run", str(program), "--steps", str(steps), "--compile", compile,
           "--threads", "1", "--out", str(out), "--quiet", "--set", f"train.log_every={LOG_EVERY}", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    total = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    points: dict[int, list] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "train":
            continue
        p = points.setdefault(r["step"], [r["time"] - start, None, None])
        p[0] = max(p[0], r["time"] - start)
        p[1 if r["problem"] == "classifier" else 2] = r.get("loss")
    config = json.loads((out / "config.json").read_text())
    return {"points": {k: tuple(v) for k, v in points.items()}, "total": total, "cpu": cpu,
            "compiled": config.get("compiled") or config.get("run", {}).get("compiled"), "config": config}


def find_compiled(config: dict):
    """The `compiled` reports wherever config.json keeps them (a list of dicts), or None."""
    stack = [config]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("compiled"), list):
                return x["compiled"]
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None


def find_decision(config: dict):
    stack = [config]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                if "decision" in k and isinstance(v, (str, dict)):
                    return v
                stack.append(v)
        elif isinstance(x, list):
            stack.extend(x)
    return None


def median_curve(runs: list[dict]) -> dict[int, tuple]:
    steps = sorted(set.intersection(*(set(r["points"]) for r in runs)))
    return {s: (statistics.median(r["points"][s][0] for r in runs),
                statistics.median(r["points"][s][1] for r in runs),
                statistics.median(r["points"][s][2] for r in runs)) for s in steps}


def crossover(curve: dict, eager: dict) -> int | None:
    """The first logged step from which ``curve``'s wall time stays below ``eager``'s."""
    steps = sorted(set(curve) & set(eager))
    for i, s in enumerate(steps):
        if all(curve[t][0] < eager[t][0] for t in steps[i:]):
            return s
    return None


def slope(curve: dict, steps: int) -> float:
    """Wall seconds per step over the last half of the run."""
    half = [s for s in sorted(curve) if s >= steps // 2]
    return (curve[half[-1]][0] - curve[half[0]][0]) / (half[-1] - half[0]) if len(half) > 1 else float("nan")


def projected_crossover(curve: dict, eager: dict, steps: int) -> float | None:
    """Where ``curve`` would pass ``eager`` if both went on at their last half's pace
    (None when it is not slower per step, or already ahead at the end)."""
    last = max(set(curve) & set(eager))
    behind = curve[last][0] - eager[last][0]
    gain = slope(eager, steps) - slope(curve, steps)
    if behind <= 0 or not gain > 0:
        return None
    return last + behind / gain


def time_to(curve: dict, loss: float):
    for s in sorted(curve):
        if curve[s][1] is not None and curve[s][1] <= loss:
            return s, curve[s][0]
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", default=str(ROOT / "programs" / "data_reweighting.mlo"))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--at", default="100,500,1000,3000", help="steps to report")
    parser.add_argument("--losses", default="0.1,0.03,0.01", help="classifier losses to report the time to")
    parser.add_argument("--modes", default=",".join(MODES), help=f"a comma list of {', '.join(MODES)}")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="passed to mloc run")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if "on-warm" in modes and "on-cold" not in modes:
        parser.error("on-warm reuses the cache of the same repetition's on-cold run: add on-cold")
    at = [int(s) for s in args.at.split(",") if int(s) <= args.steps]
    extra = [x for s in args.set for x in ("--set", s)]
    program = Path(args.program).resolve()
    results: dict[str, list] = {m: [] for m in modes}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rep in range(args.reps):
            order = [m for m in modes if m != "on-warm"]
            rng.shuffle(order)
            if "on-warm" in modes:      # right after its cold run, which fills the cache
                order.insert(order.index("on-cold") + 1, "on-warm")
            cold_cache = None
            for mode in order:
                compile, cache_kind = MODES[mode]
                if cache_kind == "warm":
                    cache = cold_cache
                else:
                    cache = Path(tempfile.mkdtemp(prefix="inductor-", dir=tmp))
                    if mode == "on-cold":
                        cold_cache = cache
                out = tmp / f"{mode}-{rep}"
                r = run_once(program, args.steps, compile, out, cache, extra)
                results[mode].append(r)
                shutil.rmtree(out, ignore_errors=True)
                print(f"  rep {rep} {mode}: {r['total']:.1f} s", file=sys.stderr, flush=True)

    curves = {m: median_curve(rs) for m, rs in results.items()}
    print(f"`{program.name}`, {args.steps} steps, one thread, {args.reps} runs per mode; median wall seconds "
          "since the process was launched (start-up, mloc's compiler, the step compiles, evaluations and "
          "checkpoints included)")
    print()
    print("| step | " + " | ".join(f"{m} s" for m in modes) + " | " +
          " | ".join(f"{m} loss (classifier / weight net)" for m in modes) + " |")
    print("|---" * (1 + 2 * len(modes)) + "|")
    for s in at:
        cells = [f"{curves[m][s][0]:.1f}" if s in curves[m] else "n/a" for m in modes]
        losses = [f"{curves[m][s][1]:.4f} / {curves[m][s][2]:.4f}" if s in curves[m] else "n/a" for m in modes]
        print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(losses) + " |")
    print()
    if "eager" in curves:
        for m in modes:
            if m == "eager":
                continue
            c = crossover(curves[m], curves["eager"])
            p = projected_crossover(curves[m], curves["eager"], args.steps)
            gain = (slope(curves["eager"], args.steps) - slope(curves[m], args.steps)) * 1e3
            print(f"- {m}: " + (f"faster than eager from step {c} on" if c is not None else
                                "never faster than eager within the run") +
                  f"; {gain:+.2f} ms per step saved over the last half" +
                  (f"; at that pace it would pass eager at step ~{p:,.0f}" if p is not None else ""))
        print()
    print("Time to a classifier loss (its mean over 10 steps; the first logged step at or below it):")
    print()
    print("| loss | " + " | ".join(f"{m}: step, s" for m in modes) + " |")
    print("|---" * (1 + len(modes)) + "|")
    for loss in (float(x) for x in args.losses.split(",")):
        cells = []
        for m in modes:
            hit = time_to(curves[m], loss)
            cells.append(f"{hit[0]}, {hit[1]:.1f}" if hit else "not reached")
        print(f"| {loss:g} | " + " | ".join(cells) + " |")
    print()
    print("Seconds in the compiler per run (config.json's `compiled` reports, median over runs), "
          "total wall seconds, total CPU seconds (user + system, of the process and the compiler's "
          "worker processes: what the run cost without the other jobs' share of the machine), and the "
          "steady step time (wall ms per step over the last half of the run, its evaluations and "
          "checkpoint included):")
    print()
    print("| mode | compiler s | reports | total wall s | total CPU s | ms per step, last half |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        compiled = [find_compiled(r["config"]) or [] for r in results[m]]
        secs = [sum(x.get("compile_seconds", 0) for x in c) for c in compiled]
        lines = "; ".join(f"{x.get('step')}: {'compiled' if x.get('compiled') else x.get('reason')}"
                          for x in compiled[0]) if compiled and compiled[0] else "none"
        steady = slope(curves[m], args.steps) * 1e3
        total = statistics.median(r["total"] for r in results[m])
        cpu = statistics.median(r["cpu"] for r in results[m])
        print(f"| {m} | {statistics.median(secs):.1f} | {lines} | {total:.1f} | {cpu:.1f} | {steady:.2f} |")
    decisions = [find_decision(r["config"]) for r in results.get("auto", [])]
    if any(decisions):
        print()
        print("auto's decision: " + json.dumps(decisions[0]))


if __name__ == "__main__":
    main()
