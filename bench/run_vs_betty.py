"""Benchmark: `mloc run`'s training step, eager and compiled, against hand-written loops and Betty 0.2.1.

The same Meta-Weight-Net program everywhere (shared/reference/peers.md): a 64-256-10
classifier trained with SGD (lr 0.1) on 40%-noisy labels, a 1-100-1 sigmoid weight net
trained with Adam (lr 1e-3) on a 500-example clean set, batch 100, fp32, CPU, one thread;
hypergradients by `darts`/`finite_diff` (eps 0.01), `neumann` (K=3, alpha=0.1), `cg` (3
iterations) and `sama` (eps 0.01; with plain SGD below its preconditioner is SGD's lr), with
1 or 5 classifier steps per weight-net step (mloc: the edge's `unroll`; Betty: the lower
problem's `unroll_steps`; hand-written: `unroll` lower steps per upper step). `--large`:
a 256-2048-10 classifier on 256-feature data, batch 512, 5120-example clean set.

Five systems, trained side by side in one process:

- **mloc** (eager) and **mloc-c** (compiled): `tests/equivalence/mwn_{finite_diff,neumann,cg,sama}.mlo`
  (the programs the equivalence test checks against the hand-written loop; `--large`
  rewrites their sizes into a temporary copy), compiled once with
  `mloc.codegen.compile.compile_program` (unroll 5 through the override
  `weight_net->classifier.unroll=5`), loaded with `load_generated`, instantiated twice with
  `mloc.runtime.processes.launch.build`: `RunConfig(compile="off")` and `compile="on"` (each
  gradient source captured with make_fx and compiled by TorchInductor at its first call,
  each optimizer commit compiled apart). The timed call is `program.outer_step()`, what
  `mloc run`'s training loop calls.
- **hand**: `tests/reference/mwn_hand.py`'s `MWNLoop.outer_step()`: `torch.autograd.grad`,
  SGD and Adam written out as torch.optim's single-tensor formulas (the eager loop a careful
  user writes).
- **hand-c**: `bench/mwn_func.py`, the same loop written with `torch.func` (`functional_call`,
  `grad`, `vjp`) so that `torch.compile(fullgraph=True)` captures each step whole, optimizer
  updates included: the loop compiled by hand as a strong user would
  (`tests/test_mwn_func.py`: equal to **hand** to 1e-12 in float64, eager and compiled).
- **hand-f** (only when `--systems` names it): hand-c's `torch.func` functions run eagerly,
  which is what the compiler is usually compared with when a compiled step is said to be
  several times faster; the transforms' wrappers make it slower than **hand**.
- **Betty**: two `ImplicitProblem`s and an `Engine`, as in Betty's Meta-Weight-Net example
  (`config.type` darts/neumann/cg/sama, `darts_alpha`, `neumann_*`, `cg_iterations=3`,
  `cg_alpha=1`, `sama_adam_alpha=0.01`, `unroll_steps` on the lower problem); one outer step is
  `unroll` calls of `engine.train_step()`. Skipped, with a message, when Betty is not
  installed (peers.md says how to install it; never a dependency of mloc). Betty's `cg` has
  the old-residual bug and its `sama` drops SGD's lr: the same work per step, different
  numbers.

Compiling: before anything is timed, each system takes `--compile-steps` outer steps
(default 3; the compiled systems first), the first of which compiles every graph; the
table of compile times gives the wall time of that first outer step and, for mloc, the
seconds each step kind spent in the compiler (`program.compiling.reports`). TorchDynamo's
cache is reset before each case (so each case compiles its own graphs), and TorchInductor's
on-disk cache is a fresh, empty directory for the process unless `--warm-cache` (so the
first case's compile times are a first run's; a later case reuses kernels whose source an
earlier one generated, in memory and on disk: the lower step's graph is the same in every
case). A trivial function is compiled before the first case, so that Inductor's one-time
start-up in the process (imports, toolchain checks, compile workers: 3–10 s here) is charged
to no system. While steps are timed a recompile is an error
(`torch._dynamo.config.error_on_recompile`): mloc would fall back to eager with the
reason, which the output then shows.

"of which data": the median time of drawing one outer step's batches alone (`unroll` from
the noisy set, one clean), timed interleaved with the systems: the same DataLoaders
(per-example indexing and collation of 100 or 512 examples) feed every system, and no
compiler touches this part; the last column is mloc-c/hand with it subtracted from both.

Timing: every system is built from the same seed; each repetition runs a block of outer
steps (default: one) of every system, in a fresh random order, and every outer step is
timed on its own by two clocks: the thread's CPU time (`time.thread_time_ns`) and wall time
(`time.perf_counter_ns`). Medians over all timed steps, after the warm-up. Every system runs
on this one thread (one intra-op thread, single-threaded Inductor kernels, no DataLoader
workers), so on an idle machine the two clocks agree; on a shared one a step that other
processes deschedule gains their time on the wall clock, which adds about the same
milliseconds to every system and pulls every ratio towards 1. The main table uses the CPU
clock (`--clock wall` to swap).
All systems take the same number of steps, so their parameters can be compared at the end
(a check that they train the same program).

Memory: the peak bytes of CPU tensor memory one outer step allocates and holds at once,
read from the allocator's own events (`torch.profiler` with `profile_memory=True`: every
allocation and free of the CPU allocator, with its address), replayed address by address
(`mloc.runtime.base.allocator`), median over 5 untimed steps after the timed ones;
parameters, optimizer states and anything else that exists before the step are not
counted, nor their frees. (Before 2026-12-02 this read the events' running total raw,
which starts at what earlier profiled steps left alive: the compiled/eager memory ratios
quoted from it, 0.78–0.96, are not comparable.) The
allocator sees a compiled step's real buffers: Inductor's fused intermediates never
exist. (`mloc.runtime.base.memory.PeakMemory`, what the planner is calibrated against,
counts storages at every aten operation through a dispatch mode, under which
`torch.compile` refuses to run.)

    python3 bench/run_vs_betty.py [--reps 600] [--block 1] [--warmup 30] [--cases darts:1,...]
                                  [--systems mloc,mloc-c,hand,hand-c,betty] [--large] [--clock cpu|wall] [--warm-cache]
                                  [--no-memory] [--profile]

`--profile` adds, per case, a cProfile of 200 eager mloc outer steps (mloc's own functions
by own time) and, for unroll 1, the median time of each part of an eager step in mloc and
by hand.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
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

import mwn_func  # noqa: E402
import mwn_hand  # noqa: E402  (puts programs/ on sys.path)
import reweighting as lib  # noqa: E402
from mloc.codegen.compile import compile_program, load_generated  # noqa: E402
from mloc.runtime.program.engine import RunConfig  # noqa: E402
from mloc.runtime.processes.launch import build  # noqa: E402

EQUIVALENCE = ROOT / "tests" / "equivalence"
METHODS = ("darts", "neumann", "cg", "sama")
CASES = [(m, u) for u in (1, 5) for m in METHODS]
LARGE_CASES = [("darts", 1), ("neumann", 1)]
MLO = {"darts": "mwn_finite_diff.mlo", "neumann": "mwn_neumann.mlo", "cg": "mwn_cg.mlo", "sama": "mwn_sama.mlo"}
HAND = {"darts": ("finite_diff", dict(eps=0.01)), "neumann": ("neumann", dict(iters=3, alpha=0.1)),
        "cg": ("cg", dict(iters=3)), "sama": ("sama", dict(eps=0.01))}
SYSTEMS = ("mloc", "mloc-c", "hand", "hand-c", "betty")
OPTIONAL = ("hand-f",)      # hand-c's functions run eagerly: what torch.func costs without the compiler
COMPILED = ("mloc-c", "hand-c")
SMALL = dict(in_features=64, hidden=256, batch_size=100, clean_size=500)
LARGE = dict(in_features=256, hidden=2048, batch_size=512, clean_size=5120)
SEED = 0


# --- the systems ---------------------------------------------------------------------------
def mlo_path(method: str, sizes: dict, tmp: Path) -> Path:
    """The equivalence program of ``method``; at other sizes, a copy with them written in."""
    path = EQUIVALENCE / MLO[method]
    if sizes == SMALL:
        return path
    f, h, b, c = sizes["in_features"], sizes["hidden"], sizes["batch_size"], sizes["clean_size"]
    text = path.read_text()
    for old, new in (("import reweighting_ref as lib", "import reweighting as lib"),  # programs/ is on sys.path
                     ("lib.MLP(in_features=64, hidden=256, classes=10)", f"lib.MLP(in_features={f}, hidden={h}, classes=10)"),
                     ("lib.noisy_digits(noise=0.4, batch_size=100)", f"lib.noisy_digits(noise=0.4, batch_size={b}, features={f})"),
                     ("lib.clean_digits(batch_size=100)", f"lib.clean_digits(batch_size={b}, size={c}, features={f})")):
        assert old in text, f"{path.name} no longer contains {old!r}"
        text = text.replace(old, new)
    out = tmp / f"large_{path.name}"
    out.write_text(text)
    return out


def compile_mloc(path: Path, unroll: int, out_dir: Path):
    overrides = (f"weight_net->classifier.unroll={unroll}",) if unroll != 1 else ()
    start = time.perf_counter()
    compiled = compile_program(str(path), overrides, out_dir)
    seconds = time.perf_counter() - start
    if not compiled.ok:
        raise SystemExit(f"mloc failed to compile {path.name}: {compiled.diagnostics}")
    return compiled, seconds


def mloc_system(compiled, out_dir: Path, compile: str):
    declaration = load_generated(compiled.source, str(out_dir / "train.py"))
    program = build(declaration, RunConfig(steps=10**9, seed=SEED, device="cpu", precision="fp32",
                                           compile=compile))

    def params():
        return {n: {k: p.detach().clone() for k, p in lv.module.named_parameters()}
                for n, lv in program.live.items()}
    return program.outer_step, params, program


def hand_system(method: str, unroll: int, sizes: dict):
    name, kwargs = HAND[method]
    loop = mwn_hand.MWNLoop(name, seed=SEED, unroll=unroll, **kwargs, **sizes)
    return loop.outer_step, loop.parameters, loop


def hand_func_system(method: str, unroll: int, sizes: dict, compile: bool):
    name, kwargs = HAND[method]
    loop = mwn_func.FuncMWN(name, compile=compile, seed=SEED, unroll=unroll, **kwargs, **sizes)
    return loop.outer_step, loop.parameters, loop


def draw_system(unroll: int, sizes: dict):
    """Only the batches one outer step draws (``unroll`` noisy, one clean), from loaders
    like everyone's: the data pipeline's share of every system's step."""
    f, b = sizes["in_features"], sizes["batch_size"]
    loaders = [lib.noisy_digits(noise=0.4, batch_size=b, features=f),
               lib.clean_digits(batch_size=b, size=sizes["clean_size"], features=f)]
    its = [iter(x) for x in loaders]

    def draw(i):
        try:
            return next(its[i])
        except StopIteration:
            its[i] = iter(loaders[i])
            return next(its[i])

    def step():
        for _ in range(unroll):
            draw(0)
        draw(1)
    return step, None, None


def betty_available() -> str | None:
    """None when Betty imports, else why not."""
    try:
        import betty  # noqa: F401
        from betty.problems import ImplicitProblem  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def betty_system(method: str, unroll: int, sizes: dict):
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
    f, b = sizes["in_features"], sizes["batch_size"]
    classifier = lib.MLP(in_features=f, hidden=sizes["hidden"], classes=10)
    weight_net = lib.WeightNet(hidden=100)
    lower_config = Config(type=method, unroll_steps=unroll, darts_alpha=0.01,
                          neumann_iterations=3, neumann_alpha=0.1, cg_iterations=3, cg_alpha=1.0,
                          sama_adam_alpha=0.01)
    lower = Classifier(name="classifier", config=lower_config, module=classifier,
                       optimizer=torch.optim.SGD(classifier.parameters(), lr=0.1),
                       train_data_loader=lib.noisy_digits(noise=0.4, batch_size=b, features=f))
    upper = WeightNet(name="weight_net", config=Config(), module=weight_net,
                      optimizer=torch.optim.Adam(weight_net.parameters(), lr=1e-3),
                      train_data_loader=lib.clean_digits(batch_size=b, size=sizes["clean_size"], features=f))
    engine = Engine(problems=[upper, lower],
                    config=EngineConfig(train_iters=10**9, strategy="cpu", logger_type="none"),
                    dependencies={"u2l": {upper: [lower]}, "l2u": {lower: [upper]}})
    engine.train()

    def outer_step():
        for _ in range(unroll):
            engine.global_step += 1
            engine.train_step()

    def params():
        return {"classifier": {k: p.detach().clone() for k, p in lower.module.named_parameters()},
                "weight_net": {k: p.detach().clone() for k, p in upper.module.named_parameters()}}
    return outer_step, params, None


# --- measurement ---------------------------------------------------------------------------
def max_relative_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for problem, params in b.items():
        for name, t in params.items():
            d = (a[problem][name].detach() - t.detach()).norm() / t.detach().norm()
            worst = max(worst, float(d))
    return worst


def measure(systems: dict, reps: int, block: int, warmup: int, rng: random.Random) -> dict:
    """Median ms per outer step of each system by both clocks: ``{"cpu": {...}, "wall": {...}}``
    (the thread's CPU time, and wall time)."""
    cpu, wall = {k: [] for k in systems}, {k: [] for k in systems}
    names = list(systems)
    for _ in range(warmup):
        for k in names:
            systems[k][0]()
    thread_ns, wall_ns = time.thread_time_ns, time.perf_counter_ns
    for _ in range(reps):
        rng.shuffle(names)
        for k in names:
            step, c, w = systems[k][0], cpu[k], wall[k]
            for _ in range(block):
                t0, c0 = wall_ns(), thread_ns()
                step()
                c1, t1 = thread_ns(), wall_ns()
                c.append(c1 - c0)
                w.append(t1 - t0)
    return {clock: {k: statistics.median(v) / 1e6 for k, v in times.items()}
            for clock, times in (("cpu", cpu), ("wall", wall))}


def compile_first(systems: dict, steps: int) -> dict:
    """Run ``steps`` outer steps of every system (so that all take the same steps), the
    compiled ones first (their first step compiles); the wall seconds of that first step."""
    first = {}
    for k in sorted(systems, key=lambda k: k not in COMPILED):
        for i in range(steps):
            start = time.perf_counter()
            systems[k][0]()
            if i == 0 and k in COMPILED:
                first[k] = time.perf_counter() - start
    return first


def allocator_peak(step) -> float:
    """The most CPU allocator bytes one call of ``step`` allocates and holds at once, from the
    allocator's ``[memory]`` events (``torch.profiler``, ``profile_memory=True``), replayed
    address by address (`mloc.runtime.base.allocator`: the events' own running total starts
    at what earlier profiled steps left alive, and their frees pull it down)."""
    from mloc.runtime.base.allocator import allocator_peak as peak
    return float(peak(step))


def steady_peak(step, n: int = 5) -> float:
    """Median of :func:`allocator_peak` over ``n`` outer steps, after one discarded (the
    first profiled call reads higher)."""
    allocator_peak(step)
    return statistics.median(allocator_peak(step) for _ in range(n))


def mloc_reports(program) -> list:
    """The reports of the steps that ran (a commit that a step's graph runs is not one)."""
    return program.compiling.ran()


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


def breakdown(method: str, program, sizes: dict, reps: int = 400) -> dict:
    """Median µs of each part of one outer step, mloc's eager engine against the hand loop,
    each part timed on its own, interleaved, on the same kind of state (unroll 1)."""
    name, kwargs = HAND[method]
    loop = mwn_hand.MWNLoop(name, seed=SEED, **kwargs, **sizes)
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
    return "n/a" if a is None or b is None else f"{a / b:.3f}"


def warm_inductor() -> float:
    """Compile and run a trivial function once: TorchInductor's one-time costs in a process
    (imports, the C++ toolchain's checks, the compile workers) then fall on no system."""
    start = time.perf_counter()
    torch.compile(lambda x: torch.relu(x * 2 + 1).sum(), fullgraph=True)(torch.randn(8))
    return time.perf_counter() - start


def run_case(method, unroll, sizes, args, tmp, rng, missing_betty):
    torch._dynamo.reset()                   # each case compiles its own graphs
    out_dir = tmp / f"{method}{unroll}"
    compiled, seconds = compile_mloc(mlo_path(method, sizes, tmp), unroll, out_dir)
    builders = {
        "mloc": lambda: mloc_system(compiled, out_dir, "off"),
        "mloc-c": lambda: mloc_system(compiled, out_dir, "on"),
        "hand": lambda: hand_system(method, unroll, sizes),
        "hand-c": lambda: hand_func_system(method, unroll, sizes, True),
        "hand-f": lambda: hand_func_system(method, unroll, sizes, False),
        "betty": lambda: betty_system(method, unroll, sizes),
    }
    wanted = [k for k in args.systems if not (k == "betty" and missing_betty)]
    built = {k: builders[k]() for k in wanted}
    systems = {k: v[:2] for k, v in built.items()}
    first = compile_first(systems, args.compile_steps)
    timed = dict(systems, draws=draw_system(unroll, sizes)[:2])
    compile_info = {"mloc_compile_program": seconds, "first_step": first}
    if "mloc-c" in built:
        compile_info["mloc_reports"] = [(r.kind, r.name, r.compiled, r.reason, r.seconds,
                                         r.operations) for r in mloc_reports(built["mloc-c"][2])]
    if "hand-c" in built:
        compile_info["hand_c"] = dict(built["hand-c"][2].compile_seconds)
    torch._dynamo.config.error_on_recompile = True
    try:
        clocks = measure(timed, args.reps, args.block, args.warmup, rng)
        med = clocks[args.clock]
        mem = {k: steady_peak(s[0]) / 2**20 for k, s in systems.items()} if not args.no_memory else {}
    finally:
        torch._dynamo.config.error_on_recompile = False
    if "mloc-c" in built:   # after the timed steps: still compiled, no recompiles?
        compile_info["mloc_after"] = [(r.kind, r.name, r.compiled, r.reason, r.recompiles, getattr(r, "fused", False))
                                      for r in mloc_reports(built["mloc-c"][2])]
    final = {k: s[1]() for k, s in systems.items()}
    base = "hand" if "hand" in final else next(iter(final))
    diff = {k: max_relative_difference(final[k], final[base]) for k in systems if k != base}
    profile = None
    if args.profile and "mloc" in built:
        profile = (profile_mloc(systems["mloc"][0]),
                   breakdown(method, built["mloc"][2], sizes) if unroll == 1 else None)
    print(f"  done {method}, unroll {unroll}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()),
          file=sys.stderr, flush=True)
    return dict(method=method, unroll=unroll, med=med, clocks=clocks, mem=mem, diff=diff, base=base,
                compile=compile_info, profile=profile)


def report(rows, args, sizes):
    steps = args.compile_steps + args.warmup + args.reps * args.block + (0 if args.no_memory else 6)
    size = "256-2048-10 classifier, batch 512" if sizes == LARGE else "64-256-10 classifier, batch 100"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, {size}; {args.reps} blocks of "
          f"{args.block} outer steps per system and case after {args.warmup} warm-up steps "
          f"(and {args.compile_steps} before them, which compile); median ms per outer step, "
          f"{'the thread' + chr(39) + 's CPU time' if args.clock == 'cpu' else 'wall time'}")
    print()
    cols = [k for k in SYSTEMS + OPTIONAL if any(k in r["med"] for r in rows)]
    tcols = cols + ["draws"]
    names = {"mloc": "mloc ms", "mloc-c": "mloc-c ms", "hand": "hand ms", "hand-c": "hand-c ms", "betty": "Betty ms",
             "draws": "of which data ms", "hand-f": "hand-f ms"}
    ratios = [("mloc-c/hand", "mloc-c", "hand"), ("mloc-c/Betty", "mloc-c", "betty"),
              ("mloc-c/hand-c", "mloc-c", "hand-c"), ("mloc/hand", "mloc", "hand"),
              ("mloc-c/mloc", "mloc-c", "mloc"), ("hand-c/hand", "hand-c", "hand"),
              ("hand-c/hand-f", "hand-c", "hand-f"), ("hand-f/hand", "hand-f", "hand")]
    ratios = [r for r in ratios if r[1] in cols and r[2] in cols]
    net = "mloc-c" in cols and "hand" in cols
    print("| method, unroll | " + " | ".join(names[k] for k in tcols) + " | " +
          " | ".join(r[0] for r in ratios) + (" | mloc-c/hand without data |" if net else " |"))
    print("|---" * (1 + len(tcols) + len(ratios) + net) + "|")
    for r in rows:
        med = r["med"]
        tail = f" | {_ratio(med['mloc-c'] - med['draws'], med['hand'] - med['draws'])} |" if net else " |"
        print(f"| {r['method']}, {r['unroll']} | " + " | ".join(f"{med[k]:.3f}" for k in tcols) + " | " +
              " | ".join(_ratio(med.get(a), med.get(b)) for _, a, b in ratios) + tail)
    other = "wall" if args.clock == "cpu" else "cpu"
    print()
    print(f"The same steps by the other clock ({'wall time' if other == 'wall' else 'the thread' + chr(39) + 's CPU time'}), "
          "median ms:")
    print()
    print("| method, unroll | " + " | ".join(names[k] for k in tcols) + " | " +
          " | ".join(r[0] for r in ratios) + " |")
    print("|---" * (1 + len(tcols) + len(ratios)) + "|")
    for r in rows:
        med = r["clocks"][other]
        print(f"| {r['method']}, {r['unroll']} | " + " | ".join(f"{med[k]:.3f}" for k in tcols) + " | " +
              " | ".join(_ratio(med.get(a), med.get(b)) for _, a, b in ratios) + " |")
    print()
    if args.inductor_start is not None:
        print(f"TorchInductor's one-time start-up in this process (a trivial function compiled before the "
              f"first case; {'warm' if args.warm_cache else 'empty'} on-disk cache): {args.inductor_start:.1f} s")
        print()
    print("Compiling (wall seconds of the first outer step, which compiles every graph; mloc: seconds in "
          "the compiler per step kind, and the captured graph's operations):")
    print()
    print("| method, unroll | mloc-c first step s | mloc-c compiler s (lower / upper) | mloc-c ops (lower / upper) | "
          "hand-c first step s | hand-c compile s (lower / upper) | mloc compile_program s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["compile"]
        reps = {kind: (secs, ops) for kind, _, _, _, secs, ops in c.get("mloc_reports", [])}
        low, up = reps.get("lower", (None, None)), reps.get("upper", (None, None))
        hc = c.get("hand_c", {})
        print(f"| {r['method']}, {r['unroll']} | {_num(c['first_step'].get('mloc-c'), '.1f')} | "
              f"{_num(low[0], '.1f')} / {_num(up[0], '.1f')} | {_num(low[1], 'd')} / {_num(up[1], 'd')} | "
              f"{_num(c['first_step'].get('hand-c'), '.1f')} | {_num(hc.get('lower'), '.1f')} / "
              f"{_num(hc.get('upper'), '.1f')} | {c['mloc_compile_program']:.2f} |")
    # SGD's commit, or a step whose graph runs SGD's update, compiles its first (momentum-initialising)
    # step as a graph of its own: one recompile there is by design (mloc/runtime/compiled/fused.py)
    eager = [(r["method"], r["unroll"], line) for r in rows for line in r["compile"].get("mloc_after", [])
             if not line[2] or line[4] > (1 if line[0] == "commit" or line[5] else 0)]
    for method, unroll, (kind, name, ok, reason, recompiles, _) in eager:
        print(f"\n**mloc-c, {method}, unroll {unroll}: {kind} step of {name} "
              f"{'ran eagerly: ' + str(reason) if not ok else f'recompiled {recompiles} times'}**")
    if rows and rows[0]["mem"]:
        print()
        print("Peak tensor memory of one outer step (MiB; allocator events, which see the compiled "
              "code's buffers too), and the largest relative parameter difference from "
              f"{rows[0]['base']} after {steps} outer steps:")
        print()
        others = [k for k in cols if k != rows[0]["base"]]
        print("| method, unroll | " + " | ".join(f"{k} MiB" for k in cols) + " | mloc-c/hand | mloc/hand | " +
              " | ".join(f"{k} vs {rows[0]['base']}" for k in others) + " |")
        print("|---" * (3 + len(cols) + len(others)) + "|")
        for r in rows:
            mem = r["mem"]
            print(f"| {r['method']}, {r['unroll']} | " + " | ".join(f"{mem[k]:.3f}" for k in cols) + " | " +
                  f"{_ratio(mem.get('mloc-c'), mem.get('hand'))} | {_ratio(mem.get('mloc'), mem.get('hand'))} | " +
                  " | ".join(f"{r['diff'][k]:.1e}" for k in others) + " |")
    for r in rows:
        if not r["profile"]:
            continue
        text, parts = r["profile"]
        if parts:
            print(f"\n### Where the time goes, eager, {r['method']}, unroll 1 (median µs per call)\n")
            print("| part | mloc | hand | mloc − hand |")
            print("|---|---|---|---|")
            for label, (a, b) in parts.items():
                d = "" if b is None else f"{a - b:+.1f}"
                print(f"| {label} | {a:.1f} | {_num(b, '.1f')} | {d} |")
        print(f"\n### cProfile of 200 eager mloc outer steps, {r['method']}, unroll {r['unroll']}: mloc's own "
              f"functions by own time\n\n```\n{text.strip()}\n```")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=None, help="blocks per system and case (600; --large 100)")
    parser.add_argument("--block", type=int, default=1, help="outer steps per block")
    parser.add_argument("--warmup", type=int, default=30, help="untimed outer steps per system")
    parser.add_argument("--compile-steps", type=int, default=3,
                        help="untimed outer steps of the compiled systems first (the first compiles)")
    parser.add_argument("--cases", default="all", help="e.g. darts:1,neumann:5 (methods: darts, neumann, cg, sama)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"a comma list of {', '.join(SYSTEMS + OPTIONAL)} (hand-f, not run by default: "
                             "hand-c's torch.func functions run eagerly)")
    parser.add_argument("--large", action="store_true",
                        help="256-2048-10 classifier, batch 512 (default cases darts:1,neumann:1)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the main table's clock: the thread's CPU time (default; a step descheduled by "
                             "other processes does not count) or wall time; the other is shown too")
    parser.add_argument("--warm-cache", action="store_true",
                        help="use TorchInductor's usual on-disk cache (default: a fresh, empty one)")
    parser.add_argument("--no-memory", action="store_true", help="skip the profiled memory steps")
    parser.add_argument("--profile", action="store_true", help="cProfile 200 eager mloc outer steps per case")
    args = parser.parse_args(argv)
    args.systems = [k for k in args.systems.split(",") if k]
    unknown = set(args.systems) - set(SYSTEMS + OPTIONAL)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS + OPTIONAL}")
    if args.reps is None:
        args.reps = 100 if args.large else 600
    torch.set_num_threads(1)
    if not args.warm_cache:     # compile times from an empty on-disk cache (a first run's)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cache-")
    sizes = LARGE if args.large else SMALL
    cases = (LARGE_CASES if args.large else CASES) if args.cases == "all" else [
        (m, int(u)) for m, u in (c.split(":") for c in args.cases.split(","))]
    missing = betty_available() if "betty" in args.systems else None
    if missing:
        print(f"Betty is not installed ({missing}); its columns are skipped. To include it:\n"
              "  pip download --no-deps --ignore-requires-python betty-ml==0.2.1\n"
              "  pip install --no-deps --ignore-requires-python betty_ml-0.2.1-py3-none-any.whl numpy\n",
              file=sys.stderr)
    rng = random.Random(0)
    rows = []
    args.inductor_start = warm_inductor() if any(k in COMPILED for k in args.systems) else None
    with tempfile.TemporaryDirectory() as tmp:
        for method, unroll in cases:
            rows.append(run_case(method, unroll, sizes, args, Path(tmp), rng, missing))
    report(rows, args, sizes)


if __name__ == "__main__":
    main()
