"""Benchmark: `mloc run`'s training step against a hand-written loop and Betty 0.2.1.

The same Meta-Weight-Net program in all three (shared/reference/peers.md): a 64-256-10
classifier trained with SGD (lr 0.1) on 40%-noisy labels, a 1-100-1 sigmoid weight net
trained with Adam (lr 1e-3) on a 500-example clean set, batch 100, fp32, CPU, one thread;
hypergradients by `darts`/`finite_diff` (eps 0.01) and `neumann` (K=3, alpha=0.1), with 1
or 5 classifier steps per weight-net step (mloc: the edge's `unroll`; Betty: the lower
problem's `unroll_steps`; hand-written: 5 lower steps per upper step).

- **mloc**: `tests/equivalence/mwn_{finite_diff,neumann}.mlo` (the programs the equivalence
  test checks against the hand-written loop), compiled once with
  `mloc.codegen.compile.compile_program` (unroll 5 through the override
  `weight_net->classifier.unroll=5`), loaded with `load_generated`, instantiated with
  `mloc.runtime.processes.launch.build`; the timed call is `program.outer_step()`, what `mloc run`'s
  training loop calls (logging, evaluation and checkpoints, every N steps, are not timed).
- **hand**: `tests/reference/mwn_hand.py`'s `MWNLoop.outer_step()` (SGD and Adam written
  out as torch.optim's single-tensor formulas); **hand+optim** is the same loop with
  `torch.optim.SGD`/`torch.optim.Adam` objects, as most people write it.
- **Betty**: two `ImplicitProblem`s and an `Engine`, as in Betty's Meta-Weight-Net example
  (`config.type`, `darts_alpha`, `neumann_*`, `unroll_steps` on the lower problem); one
  outer step is `unroll` calls of `engine.train_step()`. Skipped, with a message, when
  Betty is not installed (peers.md says how to install it; never a dependency of mloc).

Timing: every system is built from the same seed and trained side by side in one process;
each repetition runs a block of outer steps (default: one) of every system, in a fresh
random order, and every outer step is timed on its own (`time.perf_counter_ns`). Medians over all timed
steps, after a warm-up. All systems take the same number of steps, so their parameters can
be compared at the end (a check that they train the same program).

Memory: the peak bytes of CPU tensor memory one outer step allocates and holds at once,
counted storage by storage at every aten operation (`bench/hypergrad.py`'s `peak_bytes`:
`mloc.runtime.base.memory.PeakMemory`), the median over 5 untimed steps after the timed
ones (one more measured step before them is discarded);
parameters, optimizer states and anything else that exists before the step are not
counted.

Compile time: wall time of `compile_program` (frontend, dataflow trace of the user's code
on the meta device, planner, code generation); the first call in the process includes
importing the compiler's passes, later ones are the median of 5.

    python3 bench/run_vs_betty.py [--reps 600] [--block 1] [--warmup 30] [--profile]

`--profile` adds, per case, a cProfile of 200 mloc outer steps (mloc's own functions by own
time) and, for unroll 1, the median time of each part of a step in mloc and by hand.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "reference"))

import mwn_hand  # noqa: E402  (puts programs/ on sys.path)
import reweighting as lib  # noqa: E402
from hypergrad import peak_bytes  # noqa: E402
from mloc.codegen.compile import compile_program, load_generated  # noqa: E402
from mloc.runtime.program.engine import RunConfig  # noqa: E402
from mloc.runtime.processes.launch import build  # noqa: E402

EQUIVALENCE = ROOT / "tests" / "equivalence"
CASES = [("darts", 1), ("neumann", 1), ("darts", 5), ("neumann", 5)]
MLO = {"darts": "mwn_finite_diff.mlo", "neumann": "mwn_neumann.mlo"}
HAND = {"darts": ("finite_diff", dict(eps=0.01)), "neumann": ("neumann", dict(iters=3, alpha=0.1))}
SEED = 0


# --- the three systems ---------------------------------------------------------------------
def compile_mloc(method: str, unroll: int, out_dir: Path):
    overrides = (f"weight_net->classifier.unroll={unroll}",) if unroll != 1 else ()
    start = time.perf_counter()
    compiled = compile_program(str(EQUIVALENCE / MLO[method]), overrides, out_dir)
    seconds = time.perf_counter() - start
    if not compiled.ok:
        raise SystemExit(f"mloc failed to compile {MLO[method]}: {compiled.diagnostics}")
    return compiled, seconds


def mloc_system(compiled, out_dir: Path):
    declaration = load_generated(compiled.source, str(out_dir / "train.py"))
    program = build(declaration, RunConfig(steps=10**9, seed=SEED, device="cpu", precision="fp32"))

    def params():
        return {n: dict(lv.module.named_parameters()) for n, lv in program.live.items()}
    return program.outer_step, params, program


def hand_system(method: str, unroll: int, optimizers: str = "manual"):
    name, kwargs = HAND[method]
    loop = mwn_hand.MWNLoop(name, seed=SEED, unroll=unroll, optimizers=optimizers, **kwargs)
    return loop.outer_step, loop.parameters


def betty_available() -> str | None:
    """None when Betty imports, else why not."""
    try:
        import betty  # noqa: F401
        from betty.problems import ImplicitProblem  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def betty_system(method: str, unroll: int):
    from betty.configs import Config, EngineConfig
    from betty.engine import Engine
    from betty.logging.logger_base import get_logger
    from betty.problems import ImplicitProblem

    get_logger().setLevel(logging.WARNING)  # Betty logs its set-up at INFO to stdout

    class Classifier(ImplicitProblem):
        def training_step(self, batch):
            return lib.weighted_ce(self.module, self.weight_net, batch)

    class WeightNet(ImplicitProblem):
        def training_step(self, batch):
            return lib.ce(self.classifier, batch)

    random.seed(SEED)
    torch.manual_seed(SEED)
    classifier = lib.MLP(in_features=64, hidden=256, classes=10)
    weight_net = lib.WeightNet(hidden=100)
    lower_config = Config(type=method, unroll_steps=unroll, darts_alpha=0.01,
                          neumann_iterations=3, neumann_alpha=0.1)
    lower = Classifier(name="classifier", config=lower_config, module=classifier,
                       optimizer=torch.optim.SGD(classifier.parameters(), lr=0.1),
                       train_data_loader=lib.noisy_digits(noise=0.4, batch_size=100))
    upper = WeightNet(name="weight_net", config=Config(), module=weight_net,
                      optimizer=torch.optim.Adam(weight_net.parameters(), lr=1e-3),
                      train_data_loader=lib.clean_digits(batch_size=100))
    engine = Engine(problems=[upper, lower],
                    config=EngineConfig(train_iters=10**9, strategy="cpu", logger_type="none"),
                    dependencies={"u2l": {upper: [lower]}, "l2u": {lower: [upper]}})
    engine.train()

    def outer_step():
        for _ in range(unroll):
            engine.global_step += 1
            engine.train_step()

    def params():
        return {"classifier": dict(lower.module.named_parameters()),
                "weight_net": dict(upper.module.named_parameters())}
    return outer_step, params


# --- measurement ---------------------------------------------------------------------------
def max_relative_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for problem, params in b.items():
        for name, t in params.items():
            d = (a[problem][name].detach() - t.detach()).norm() / t.detach().norm()
            worst = max(worst, float(d))
    return worst


def measure(systems: dict, reps: int, block: int, warmup: int, rng: random.Random) -> dict:
    times = {k: [] for k in systems}
    names = list(systems)
    for _ in range(warmup):
        for k in names:
            systems[k][0]()
    for _ in range(reps):
        rng.shuffle(names)
        for k in names:
            step, out = systems[k][0], times[k]
            for _ in range(block):
                start = time.perf_counter_ns()
                step()
                out.append(time.perf_counter_ns() - start)
    return {k: statistics.median(v) / 1e6 for k, v in times.items()}


def steady_peak(step, n: int = 5) -> float:
    """Median of ``peak_bytes`` over ``n`` measured outer steps, after one discarded (with
    ``torch.profiler``'s replay, which this replaced, the first call read higher for every
    system)."""
    peak_bytes(step)
    return statistics.median(peak_bytes(step) for _ in range(n))


def profile_mloc(step, steps: int = 200, top: int = 15) -> str:
    """cProfile of ``steps`` mloc outer steps: mloc's own functions, by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(r"mloc/(runtime|codegen)|mloc_generated|train\.py", top)
    text = buf.getvalue()
    return text[text.index("ncalls"):] if "ncalls" in text else text


def breakdown(method: str, program, reps: int = 400) -> dict:
    """Median µs of each part of one outer step, mloc's engine against the hand loop, each
    part timed on its own, interleaved, on the same kind of state (unroll 1)."""
    name, kwargs = HAND[method]
    loop = mwn_hand.MWNLoop(name, seed=SEED, **kwargs)
    lower, upper = program.live["classifier"], program.live["weight_net"]
    program.lower_step("classifier")
    loop.lower_step()
    program.draw("weight_net")
    val = loop._next("weight_net")
    hyper = [torch.randn_like(p) * 1e-3 for p in upper.problem.params]
    zero = [torch.zeros_like(p) for p in lower.problem.params]

    def commit(lv, grads):  # the engine's commit (the watch is timed apart)
        lv.commit(grads)

    def mloc_adam():
        commit(upper, hyper)

    def hand_adam():
        saved = loop.hypergradient
        loop.hypergradient = lambda _: hyper
        loop._next, nxt = (lambda _: val), loop._next
        try:
            loop.upper_step()
        finally:
            loop.hypergradient, loop._next = saved, nxt

    def mloc_sgd():
        commit(lower, zero)

    def hand_sgd():
        with torch.no_grad():
            for p, g in zip(loop.theta, zero):
                p.add_(g, alpha=-loop.lr)

    def mloc_hyper():       # returned, as the engine's upper step takes it
        program.hierarchy.hypergrad("weight_net", False)

    watch_loss = program.guard.loss_watcher("classifier")
    watch_grads = program.guard.grads_watcher("weight_net", "hypergradient")
    program.guard.watch(0, "weight_net", hyper, "hypergradient")   # makes the flag pool

    parts = {
        "lower step (draw, loss, grad, SGD)": (lambda: program.lower_step("classifier"), loop.lower_step),
        "upper step (draw, hypergradient, Adam)": (lambda: program.upper_step("weight_net"), loop.upper_step),
        "  draw a batch": (lambda: program.draw("classifier"), lambda: loop._next("classifier")),
        "  hypergradient": (mloc_hyper, lambda: loop.hypergradient(val)),
        "  SGD commit (4 tensors)": (mloc_sgd, hand_sgd),
        "  Adam commit (4 tensors)": (mloc_adam, hand_adam),
        "  NaN/Inf watch of the loss": (lambda: watch_loss(0, lower.last_loss), None),
        "  NaN/Inf watch of the hypergradient (4 tensors)": (lambda: watch_grads(0, hyper), None),
    }
    jobs = [(label, i, fn) for label, fns in parts.items() for i, fn in enumerate(fns) if fn is not None]
    times = {(label, i): [] for label, i, _ in jobs}
    rng = random.Random(1)
    for rep in range(reps + 20):
        rng.shuffle(jobs)
        for label, i, fn in jobs:
            start = time.perf_counter_ns()
            fn()
            if rep >= 20:
                times[(label, i)].append(time.perf_counter_ns() - start)
    return {label: tuple(statistics.median(times[(label, i)]) / 1e3 if (label, i) in times else None
                         for i in range(2)) for label in parts}


def _num(x, spec):
    return "n/a" if x is None else format(x, spec)


def _ratio(a, b):
    return "n/a" if b is None else f"{a / b:.3f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=600, help="blocks per system and case")
    parser.add_argument("--block", type=int, default=1, help="outer steps per block")
    parser.add_argument("--warmup", type=int, default=30, help="untimed outer steps per system")
    parser.add_argument("--cases", default="all", help="e.g. darts:1,neumann:5")
    parser.add_argument("--profile", action="store_true", help="cProfile 200 mloc outer steps per case")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = CASES if args.cases == "all" else [
        (m, int(u)) for m, u in (c.split(":") for c in args.cases.split(","))]
    missing = betty_available()
    if missing:
        print(f"Betty is not installed ({missing}); its columns are skipped. To include it:\n"
              "  pip download --no-deps --ignore-requires-python betty-ml==0.2.1\n"
              "  pip install --no-deps --ignore-requires-python betty_ml-0.2.1-py3-none-any.whl numpy\n",
              file=sys.stderr)
    rng = random.Random(0)
    rows, compile_times, profiles = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, unroll in cases:
            out_dir = Path(tmp) / f"{method}{unroll}"
            compiled, seconds = compile_mloc(method, unroll, out_dir)
            warm = [compile_mloc(method, unroll, out_dir)[1] for _ in range(5)]
            compile_times.append((method, unroll, seconds, statistics.median(warm)))
            step, params, _program = mloc_system(compiled, out_dir)
            systems = {"mloc": (step, params),
                       "hand": hand_system(method, unroll),
                       "hand+optim": hand_system(method, unroll, "torch")}
            if not missing:
                systems["betty"] = betty_system(method, unroll)
            med = measure(systems, args.reps, args.block, args.warmup, rng)
            mem = {k: steady_peak(s[0]) / 2**20 for k, s in systems.items()}
            final = {k: s[1]() for k, s in systems.items()}
            diff = {k: max_relative_difference(final[k], final["hand"]) for k in systems if k != "hand"}
            rows.append((method, unroll, med, mem, diff))
            if args.profile:
                profiles[(method, unroll)] = (profile_mloc(step), breakdown(method, _program)
                                              if unroll == 1 else None)
            print(f"  done {method}, unroll {unroll}: " + ", ".join(
                f"{k} {v:.3f} ms" for k, v in med.items()), file=sys.stderr)

    steps = args.warmup + args.reps * args.block + 6
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, {args.reps} blocks of "
          f"{args.block} outer steps per system and case after {args.warmup} warm-up steps; "
          "median ms per outer step")
    print()
    print("| method, unroll | mloc ms | hand ms | hand+optim ms | Betty ms | mloc/hand | "
          "mloc/hand+optim | mloc/Betty |")
    print("|---|---|---|---|---|---|---|---|")
    for method, unroll, med, *_ in rows:
        b = med.get("betty")
        print(f"| {method}, {unroll} | {med['mloc']:.3f} | {med['hand']:.3f} | "
              f"{med['hand+optim']:.3f} | {_num(b, '.3f')} | {med['mloc'] / med['hand']:.3f} | "
              f"{med['mloc'] / med['hand+optim']:.3f} | {_ratio(med['mloc'], b)} |")
    print()
    print("Peak tensor memory of one outer step (MiB), and the largest relative parameter "
          f"difference from the hand-written loop after {steps} outer steps:")
    print()
    print("| method, unroll | mloc MiB | hand MiB | hand+optim MiB | Betty MiB | mloc/hand | "
          "mloc/Betty | mloc vs hand | hand+optim vs hand | Betty vs hand |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method, unroll, _, mem, diff in rows:
        b = mem.get("betty")
        print(f"| {method}, {unroll} | {mem['mloc']:.3f} | {mem['hand']:.3f} | "
              f"{mem['hand+optim']:.3f} | {_num(b, '.3f')} | {mem['mloc'] / mem['hand']:.3f} | "
              f"{_ratio(mem['mloc'], b)} | {diff['mloc']:.1e} | {diff['hand+optim']:.1e} | "
              f"{_num(diff.get('betty'), '.1e')} |")
    print()
    print("mloc compile time (`compile_program`, s): " + "; ".join(
        f"{m}, unroll {u}: first {first:.3f}, then {warm:.3f}" for m, u, first, warm in compile_times))
    for (method, unroll), (text, parts) in profiles.items():
        if parts:
            print(f"\n### Where the time goes, {method}, unroll 1 (median µs per call)\n")
            print("| part | mloc | hand | mloc − hand |")
            print("|---|---|---|---|")
            for label, (a, b) in parts.items():
                d = "" if b is None else f"{a - b:+.1f}"
                print(f"| {label} | {a:.1f} | {_num(b, '.1f')} | {d} |")
        print(f"\n### cProfile of 200 mloc outer steps, {method}, unroll {unroll}: mloc's own "
              f"functions by own time\n\n```\n{text.strip()}\n```")


if __name__ == "__main__":
    main()
