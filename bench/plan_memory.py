"""The planner's memory estimates against allocator-level measurements, every method and mode.

    python3 bench/plan_memory.py                 # the table: every method and itd mode on the examples
    python3 bench/plan_memory.py --itd 10 100    # hpo.mlo's itd modes at K = 10, 100: memory and time
    python3 bench/plan_memory.py --itd 1000
    python3 bench/plan_memory.py --compiled       # the compiled column: every step under `--compile on`

For each case (an example program of `programs/`, with `--set` overrides that choose the
method, the mode, the unroll or the sizes) the program is compiled (the planner's estimate
of each edge: `mloc plan`'s memory column) and built; two outer steps run, and each upper
problem's hypergradient step of the second (its batch drawn, the hypergradient through
every problem below it, its optimizer step: `Program.upper_step`, or `accumulate` in a
meta-batch) is measured by `mloc.runtime.base.memory.PeakMemory`: the peak bytes of tensor
storage the step allocates and holds at once, counted storage by storage at every aten
operation (not `torch.profiler`'s allocator replay, which missed whole batches). The
first step is discarded (optimizer states and caches are made there).

`tests/test_plan_memory.py` runs `CASES` that cover each method and mode of the registry
and asserts estimate/measured within `TOLERANCE`; this script prints the full table.

`--compiled`: the same cases under `--compile on`, against the planner's compiled estimate
(`mloc plan`'s compiled column). A compiled step runs Inductor's generated code, which no
dispatch mode sees: its peak is read from the CPU allocator's own events
(`mloc.runtime.base.allocator`), in the third outer step (the first two compile: SGD's
commit compiles its first step apart). `tests/test_plan_memory.py` checks the same
tolerance for it (slow tier: each case compiles its steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mloc  # noqa: E402
from mloc.runtime.base.allocator import allocator_peak  # noqa: E402
from mloc.runtime.base.memory import PeakMemory  # noqa: E402

PROGRAMS = ROOT / "programs"
TOLERANCE = 1.5          # estimate / measured within [1/1.5, 1.5]
MWN = "weight_net->classifier"
SMALL_WEIGHTS = ("weight_net.module.hidden=2",)       # m = 7: forward mode pushes m directions a step


@dataclass(frozen=True)
class Case:
    program: str                        # a file of programs/
    sets: tuple[str, ...] = ()          # `--set` overrides
    label: str = ""

    @property
    def path(self) -> Path:
        return PROGRAMS / self.program

    def __str__(self) -> str:
        """The program and its overrides, each without its edge (`hypergrad=cg`)."""
        return self.label or self.program.removesuffix(".mlo") + "".join(f" {s.split('.', 1)[-1] if '->' in s else s}"
                                                                          for s in self.sets)


def mwn(method: str, *more: str, unroll: int = 1) -> Case:
    return Case("data_reweighting.mlo", (f"{MWN}.hypergrad={method}", f"{MWN}.unroll={unroll}", *more))


def hpo(method: str, unroll: int = 50, *more: str) -> Case:
    return Case("hpo.mlo", (f"decay->model.hypergrad={method}", f"decay->model.unroll={unroll}", *more))


def registry_cases() -> list[tuple[str, Case]]:
    """One case per method of the registry and per mode of a method that has modes (`itd`),
    on data_reweighting.mlo (every method applies to it): a method added to the registry is
    measured here without a line changed. `auto` (and `mode = auto`) has no cost of its own:
    the planner resolves it to one of these. A method that unrolls gets `unroll = 2`; forward
    mode a 7-parameter weight net (it pushes m tangent directions through each step)."""
    from mloc.builtins import METHODS

    out = []
    for name, desc in METHODS.items():
        if desc.cost is None:
            continue
        modes = next((p.type.choices for p in desc.signature.params if p.name == "mode"), None)
        unroll = 2 if desc.caps.unrolls else 1
        for mode in [m for m in modes if m != "auto"] if modes else [None]:
            call = f"{name}(mode={mode})" if mode else name
            small = SMALL_WEIGHTS if mode == "forward" else ()
            out.append((call, mwn(call, *small, unroll=unroll)))
    return out


# the examples with a hierarchy edge (the interlocking chains compute no hypergradient)
EXAMPLES = tuple(Case(p.name) for p in sorted(PROGRAMS.glob("*.mlo")) if " -> " in p.read_text())

# iMAML's meta-batch vectorized (`vmap = true`): every task's step at once
VMAP = (Case("imaml.mlo", ("meta.vmap=true",)),
        Case("imaml.mlo", ("meta.vmap=true", "meta.accumulate=8", "meta->adapt.hypergrad=neumann(iters=5)")))

# Every example as written, then every method and itd mode on the examples that can run it:
# forward mode with one batch of directions (m = 7, 30), two and their concatenation (m = 61),
# 56 (maml.mlo, m = 1761, an `init` lower), and through one differentiated step (truncate = 1);
# recompute with √T checkpoints at T = 3, 10, 50 and truncated.
CASES: tuple[Case, ...] = (
    *EXAMPLES,
    mwn("finite_diff"), mwn("neumann(iters=3)"), mwn("cg(iters=5)"), mwn("first_order"),
    mwn("itd(mode=reverse)", unroll=3), mwn("itd(mode=recompute)", unroll=3),
    mwn("itd(mode=forward)", *SMALL_WEIGHTS, unroll=2), mwn("itd(steps=3, truncate=1, mode=reverse)", unroll=3),
    mwn("itd(steps=3, truncate=1, mode=forward)", *SMALL_WEIGHTS, unroll=3),
    mwn("itd(mode=forward)", "weight_net.module.hidden=20", unroll=2),
    hpo("itd(mode=reverse)", 10), hpo("itd(mode=recompute)", 10), hpo("itd(mode=forward)", 5),
    hpo("itd(mode=reverse)"), hpo("itd(mode=recompute)"), hpo("itd(steps=50, truncate=20, mode=recompute)"),
    hpo("neumann(iters=5)"), hpo("sama"), hpo("finite_diff"),
    Case("maml.mlo", ("meta->adapt.hypergrad=itd(mode=recompute)",)),
    Case("maml.mlo", ("meta->adapt.hypergrad=itd(mode=forward)",)),
    Case("maml.mlo", ("meta->adapt.hypergrad=first_order",)),
    Case("imaml.mlo", ("meta->adapt.hypergrad=neumann(iters=5)",)),
    *VMAP,
)


def load(case: Case, compiled: bool = False):
    return mloc.load(case.path, set=case.sets, compile="on" if compiled else "off")


class _Allocator:
    """:func:`allocator_peak` read like a :class:`PeakMemory` (``peak``)."""

    def __init__(self, step):
        self.peak = allocator_peak(step)


def measure(session, detail: bool = False, compiled: bool = False) -> dict[str, PeakMemory]:
    """Each upper problem's hypergradient step in the second outer step of ``session`` (the
    third, ``compiled``: the first two compile): its :class:`PeakMemory` (compiled: its
    allocator-event peak), the largest when the step runs several times (`accumulate`; a
    vectorized meta-batch, `vmap = true`, is one step: every task's solve and hypergradient)."""
    program = session.program
    for _ in range(2 if compiled else 1):
        program.outer_step()
    found: dict[str, PeakMemory] = {}
    for kind in ("upper_step", "accumulate", "meta_batch"):
        step = getattr(program, kind)

        def measured(name, *args, _step=step, **kwargs):
            if compiled:
                mem = _Allocator(lambda: _step(name, *args, **kwargs))
            else:
                with PeakMemory(detail) as mem:
                    _step(name, *args, **kwargs)
            if name not in found or mem.peak > found[name].peak:
                found[name] = mem
        setattr(program, kind, measured)
    program.outer_step()
    return found


def rows(case: Case, compiled: bool = False):
    """``(edge, method, estimate, measured)`` for each edge of ``case``'s plan (measured: the
    upper's step; an upper with several edges is measured once, against the largest);
    ``compiled``: the steps compiled, against the compiled estimate."""
    session = load(case, compiled)
    peaks = measure(session, compiled=compiled)
    for e in session.plan.edges:
        yield f"{e.upper} -> {e.lower}", e.render(), e.compiled_memory if compiled else e.memory, peaks[e.upper].peak


def ratio(estimate: int | None, measured: int) -> float:
    return float("nan") if estimate is None else estimate / measured


def table(cases, compiled: bool = False) -> int:
    print("| case | edge | method | estimate KiB | measured KiB | estimate / measured |")
    print("|---|---|---|---|---|---|")
    worst = 1.0
    for case in cases:
        for edge, method, est, got in rows(case, compiled):
            r = ratio(est, got)
            worst = max(worst, r, 1 / r)
            print(f"| {case} | {edge} | {method} | {est / 1024:.1f} | {got / 1024:.1f} | {r:.2f} |", flush=True)
    print(f"\nworst factor: {worst:.2f} (tolerance {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


def itd_sweep(ks, reps: int, modes=("reverse", "recompute", "forward")) -> None:
    """hpo.mlo's three itd modes at each K: estimate, measured peak, median ms per step."""
    print("| mode | K | estimate KiB | measured KiB | estimate / measured | ms per hypergradient step |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        for mode in modes:
            session = load(hpo(f"itd(mode={mode})", k))
            est = session.plan.edges[0].memory
            p = session.program
            p.outer_step()
            times = []
            for _ in range(reps):       # timed before measuring (the measurement slows every operation)
                t0 = time.perf_counter()
                p.upper_step("decay")
                times.append(time.perf_counter() - t0)
            got = measure(session)["decay"].peak
            print(f"| {mode} | {k} | {est / 1024:.1f} | {got / 1024:.1f} | {est / got:.2f} | "
                  f"{statistics.median(times) * 1e3:.1f} |", flush=True)
    print()
    for k in ks:
        for budget in (None, "100KiB", "60KiB", "40KiB", "30KiB"):
            e = choice(k, budget)
            print(f"- K = {k}, budget {budget or 'none'}: **{e.mode}**, {e.memory / 1024:.1f} KiB ({e.reason})")


def choice(k: int, budget: str | None):
    """The planner's edge for `itd(mode=auto)` on hpo.mlo at unroll ``k`` under ``budget``."""
    from mloc.codegen.compile import compile_program

    case = hpo("itd(mode=auto)", k, *((f'train.memory_budget="{budget}"',) if budget else ()))
    return compile_program(str(case.path), case.sets).plan.edges[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--itd", type=int, nargs="*", help="hpo.mlo's itd modes at these unrolls K instead")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per mode and K (--itd)")
    ap.add_argument("--modes", nargs="*", default=["reverse", "recompute", "forward"], help="itd modes (--itd)")
    ap.add_argument("--compiled", action="store_true", help="the steps compiled, against the compiled estimates")
    ap.add_argument("--cases", choices=("all", "registry", "examples"), default="all",
                    help="every case, one per method and mode, or the examples as written")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.itd:
        itd_sweep(args.itd, args.reps, args.modes)
        return 0
    cases = {"all": CASES, "registry": [c for _, c in registry_cases()], "examples": EXAMPLES}[args.cases]
    return table(cases, args.compiled)


if __name__ == "__main__":
    sys.exit(main())
