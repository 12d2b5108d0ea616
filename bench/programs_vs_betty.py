"""mloc against Betty 0.2.1 on every program in ``programs/`` (issue 27): one table.

    python3 bench/programs_vs_betty.py [--programs a,b] [--quick] [--seeds 1,2,3] [--no-seeds]
                                       [--reps 30] [--warmup 3] [--json OUT]

Each row is one module of ``bench/betty_programs/`` (its docstring has the interface): Betty's
version of the program, built from the program's own Python module (its ``lib.*`` modules,
losses, loaders), or the reason Betty cannot express it with the evidence. Per row:

1. **First-step hypergradient agreement, float64.** ``mloc.load(program, dtype="float64")``
   with each upper problem's optimizer made plain SGD with rate 1 (``AGREE``), Betty's
   program built around deep copies of mloc's initial modules; one outer step of each;
   each upper's ``θ₀ − θ₁`` is its hypergradient; the figure is ``‖g_Betty − g_mloc‖ /
   ‖g_mloc‖`` over all upper parameters, per check (``CHECKS``: the method as written and,
   where Betty's differs, a method both compute alike). Also the largest relative
   difference of every module's parameters and buffers (BatchNorm statistics) after the step.
2. **Time per outer step and peak memory**, float32, the program as written: both systems in
   one process, one thread, stepped in a fresh random order each round; the median of the
   thread's CPU time per outer step (``--reps`` after ``--warmup``); peak memory as
   ``bench/run_vs_betty.py`` measures it (the CPU allocator's largest running total within
   one outer step, median of 5 after one; parameters and optimizer state not counted).
3. **Final metric over seeds** (mean ± sample std): mloc's by ``mloc sweep --seeds S
   --steps N --jobs 2 --threads 1 --compile off``; Betty's by its own runs from the same
   seed's initial modules (``mloc.load(seed=s)``), N outer steps, then the program's
   evaluation on Betty's modules. N is the row's ``SEED_STEPS``: the program's own step
   count unless the table says otherwise.

``--quick``: a smoke run (tiny modules for step 1, 3 + 5 timed steps, one seed of 5 steps).
Betty is an optional benchmark dependency (shared/reference/peers.md: ``pip download
--no-deps --ignore-requires-python betty-ml==0.2.1``, then ``pip install --no-deps
--ignore-requires-python <wheel> numpy``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import betty_programs  # noqa: E402
from betty_programs.common import betty_missing, flat, hypergradient, one_step  # noqa: E402

import mloc  # noqa: E402


def path_of(row) -> Path:
    return ROOT / "programs" / f"{row.PROGRAM}.mlo"


def _buffers(module) -> torch.Tensor | None:
    bs = [b.detach().reshape(-1).double() for b in module.buffers() if b.is_floating_point()]
    return torch.cat(bs) if bs else None


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def first_step(row, check, tiny: bool = False) -> dict:
    """One outer step of both systems in float64 from the same modules (module docstring, 1)."""
    init, m, b = one_step(row, [*check.mloc_set, *(row.TINY if tiny else ())], dict(check.betty) or None)
    out = {"check": check.label, "same": check.same}
    if row.UPPERS:
        g_m, g_b = hypergradient(row, init, m), hypergradient(row, init, b)
        out.update(hyper=_rel(g_b, g_m), hyper_norm=float(g_m.norm()), betty_norm=float(g_b.norm()))
    out["params"] = max(_rel(flat(b[n]), flat(m[n])) for n in init)
    bufs = [(_buffers(m[n]), _buffers(b[n])) for n in init]
    bufs = [_rel(y, x) for x, y in bufs if x is not None]
    out["buffers"] = max(bufs) if bufs else None
    return out


def _peak(step) -> float:
    from run_vs_betty import steady_peak
    return steady_peak(step) / 2**20


def timing(row, reps: int, warmup: int, tiny: bool = False) -> dict:
    """Median thread-CPU and wall ms per outer step, float32, as written (docstring, 2)."""
    prog = mloc.load(path_of(row), set=list(row.TINY) if tiny else [])
    betty = row.build({n: prog.module(n) for n in prog.program.live})
    systems = {"mloc": prog.step, "betty": betty.step}
    from darts_vs_betty import interleaved_medians
    return {**interleaved_medians(systems, reps, warmup), "peak": {k: _peak(step) for k, step in systems.items()}}


def mloc_seeds(row, seeds: list[int], steps: int, out: Path) -> dict:
    """``mloc sweep`` over ``seeds``: the final ``METRIC`` per seed and the sweep's wall s."""
    cmd = [sys.executable, "-m", "mloc", "sweep", str(path_of(row)), "--seeds", ",".join(map(str, seeds)),
           "--steps", str(steps), "--jobs", "2", "--threads", "1", "--compile", "off", "--out", str(out)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    record = json.loads((out / "sweep.json").read_text())
    final = record["points"][0]["final"]
    if row.METRIC not in final:
        raise KeyError(f"{row.PROGRAM}: the sweep has no metric {row.METRIC!r} (it has {sorted(final)})")
    return {"values": final[row.METRIC], "wall": wall}


def betty_seeds(row, seeds: list[int], steps: int) -> dict:
    """Betty's runs from each seed's initial modules: the final metric per seed, and the
    mean wall seconds of a run's training."""
    values, walls = [], []
    for s in seeds:
        prog = mloc.load(path_of(row), seed=s)
        betty = row.build({n: prog.module(n) for n in prog.program.live}, steps=steps)
        start = time.perf_counter()
        for _ in range(steps):
            betty.step()
        walls.append(time.perf_counter() - start)
        values.append(row.metric(betty.modules))
    return {"values": values, "wall": statistics.mean(walls)}


def _phase(result: dict, key: str, fn) -> None:
    """``result[key] = fn()``; a failure is recorded (``result["errors"]``), not raised, so that
    one row's failure does not lose a long run."""
    try:
        result[key] = fn()
    except Exception as e:  # noqa: BLE001
        result.setdefault("errors", []).append(f"{key}: {type(e).__name__}: {str(e)[:300]}")
    print(f"  {result['program']}: {key} done", file=sys.stderr, flush=True)


def measure(row, args) -> dict:
    result = {"program": row.PROGRAM, "betty": row.BETTY, "method": row.METHOD}
    if row.BETTY is not None:
        _phase(result, "evidence", row.evidence)
        return result
    _phase(result, "checks", lambda: [first_step(row, c, tiny=args.quick) for c in row.CHECKS])
    _phase(result, "timing", lambda: timing(row, args.reps, args.warmup, tiny=args.quick))
    if hasattr(row, "evidence"):
        _phase(result, "evidence", row.evidence)
    if args.seeds:
        result["steps"] = steps = args.steps or row.SEED_STEPS
        result["program_steps"] = mloc.load(path_of(row)).declaration.defaults.steps
        with tempfile.TemporaryDirectory() as tmp:
            _phase(result, "mloc_seeds", lambda: mloc_seeds(row, args.seeds, steps, Path(tmp) / "sweep"))
        _phase(result, "betty_seeds", lambda: betty_seeds(row, args.seeds, steps))
    return result


def _ms(values, spec=".4f") -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def _agreement_cell(r) -> str:
    checks = r.get("checks") or []
    if not checks or "hyper" not in checks[0]:
        return f"n/a; weights {checks[0]['params']:.1e}" if checks else "–"
    first, rest = checks[0], [c for c in checks[1:] if c["same"]]
    cell = f"{first['hyper']:.1e}" + ("" if first["same"] else " (differs)")
    if rest:
        cell += "; " + ", ".join(f"{c['check'].split(' / ')[0]}: {c['hyper']:.1e}" for c in rest)
    return cell


def main_row(r) -> str:
    name = f"`{r['program']}`"
    if r["betty"] is not None:
        return f"| {name} | no: {r['betty']} | {r['method']} | – | – | – | – | – | – |"
    t = r.get("timing")
    ms, mb = r.get("mloc_seeds"), r.get("betty_seeds")
    steps = f"{r['steps']} × {len(ms['values'])}" if ms else "–"
    if ms and r.get("program_steps") not in (None, r["steps"]):
        steps += f" (reduced; the program: {r['program_steps']})"
    fin_m = _ms(ms["values"]) if ms else "–"
    fin_b = _ms(mb["values"]) if mb else "–"
    cpu = f"{t['cpu']['mloc']:.2f} / {t['cpu']['betty']:.2f}" if t else "–"
    peak = f"{t['peak']['mloc']:.2f} / {t['peak']['betty']:.2f}" if t else "–"
    return f"| {name} | yes | {r['method']} | {_agreement_cell(r)} | {cpu} | {peak} | {fin_m} | {fin_b} | {steps} |"


def table(results: list[dict], args) -> str:
    lines = [f"torch {torch.__version__}, 1 thread; first step float64; time and memory float32, {args.reps} outer "
             f"steps per system after {args.warmup}; seeds {','.join(map(str, args.seeds)) or 'none'}; "
             f"{args.total:.0f} s in all", "",
             "| program | Betty expresses it | method, mloc → Betty | first-step hypergradient, rel. diff (as written; "
             "same method) | CPU ms / outer step, mloc / Betty | peak MiB, mloc / Betty | final metric, mloc | "
             "final metric, Betty | steps × seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [main_row(r) for r in results]
    lines += ["", "First outer step, float64, every check (‖g_Betty − g_mloc‖ / ‖g_mloc‖; parameters and floating "
              "buffers of every module after the step, largest relative difference):", "",
              "| program | check (mloc / Betty) | same method | hypergradient | ‖g‖ mloc / Betty | parameters | buffers |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        for c in r.get("checks") or []:
            hyper = (f"{c['hyper']:.1e} | {c['hyper_norm']:.4g} / {c['betty_norm']:.4g}" if "hyper" in c else "n/a | –")
            buffers = "–" if c["buffers"] is None else f"{c['buffers']:.1e}"
            lines.append(f"| `{r['program']}` | {c['check']} | {'yes' if c['same'] else 'no'} | {hyper} | "
                         f"{c['params']:.1e} | {buffers} |")
    lines += ["", "Time per outer step, wall ms (median, same steps), and the seed runs' wall s (mloc: the "
              "whole sweep, 2 runs at a time; Betty: one run's training, mean):", "",
              "| program | wall ms mloc / Betty | CPU mloc/Betty | sweep s (mloc) | run s (Betty) |", "|---|---|---|---|---|"]
    for r in results:
        if "timing" in r:
            t, ms, mb = r["timing"], r.get("mloc_seeds"), r.get("betty_seeds")
            sweep = f"{ms['wall']:.0f}" if ms else "–"
            run = f"{mb['wall']:.1f}" if mb else "–"
            lines.append(f"| `{r['program']}` | {t['wall']['mloc']:.2f} / {t['wall']['betty']:.2f} | "
                         f"{t['cpu']['mloc'] / t['cpu']['betty']:.3f} | {sweep} | {run} |")
    seeded = [r for r in results if r.get("mloc_seeds") or r.get("betty_seeds")]
    if seeded:
        lines += ["", f"Final metric per seed ({', '.join(map(str, args.seeds))}):", "",
                  "| program | metric | mloc | Betty |", "|---|---|---|---|"]
        for r in seeded:
            per = [", ".join(f"{v:.4f}" for v in (r.get(k) or {}).get("values", [])) or "–"
                   for k in ("mloc_seeds", "betty_seeds")]
            metric = betty_programs.row(r["program"]).METRIC
            lines.append(f"| `{r['program']}` | {metric} | {per[0]} | {per[1]} |")
    errors = [(r["program"], e) for r in results for e in r.get("errors", [])]
    if errors:
        lines += ["", "Failures of this run:", ""] + [f"- `{p}`: {e}" for p, e in errors]
    ev = [(r["program"], what, value) for r in results for what, value in r.get("evidence") or []]
    if ev:
        lines += ["", "Evidence (measured in this run):", ""]
        lines += [f"- `{p}`: {what}: **{value}**" for p, what, value in ev]
    return "\n".join(lines)


def report(results: list[dict], args) -> None:
    print(table(results, args))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", default=None, help=f"comma list (default all: {', '.join(betty_programs.names())})")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny modules, few steps, one seed")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--no-seeds", action="store_true", help="skip the final-metric runs")
    p.add_argument("--steps", type=int, default=None, help="outer steps of the seed runs (default: each row's)")
    p.add_argument("--reps", type=int, default=30, help="timed outer steps per system")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    missing = betty_missing()
    if missing:
        print(f"Betty is not installed ({missing}); see this file's docstring", file=sys.stderr)
        return 2
    try:
        rows = [betty_programs.row(n) for n in (args.programs.split(",") if args.programs else betty_programs.names())]
    except KeyError as e:
        p.error(str(e.args[0]))
    if args.quick:
        args.reps, args.warmup, args.steps = 5, 3, args.steps or 5
        args.seeds = "1"
    args.seeds = [] if args.no_seeds else [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(1)
    start = time.perf_counter()
    results = []
    for row in rows:
        print(f"{row.PROGRAM} ...", file=sys.stderr, flush=True)
        results.append(measure(row, args))
        if args.json:   # after every row: a long run's finished rows survive a later failure
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    args.total = time.perf_counter() - start
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
