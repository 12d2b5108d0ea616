"""`mloc hypergrad FILE [--after N]`: each upper problem's hypergradient, without a training run.

At the initial state, or (`--after N`) after N outer steps of the program's own schedule:
the state `mloc.load(FILE).run(N)` reaches, on the batches its last steps drew (a problem
with no batch yet draws its first), so the values equal the Python API's
`hypergradients()` there bit for bit. Nothing is written. `--json` prints every value,
`--dtype float64` computes in double precision, and `--check` compares each hypergradient
with the same state's hypergradient when every edge that does not unroll is solved by CG to
convergence, reports the curvature of those edges' lower problems (where one is not positive
definite, CG's answer is no reference) and ends with a verdict line.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from mloc.cli.output import EXIT_ERRORS, EXIT_OK, Output, UsageError
from mloc.cli.train import _compiled
from mloc.codegen.compile import Compiled, load_generated

HELP = "compute each upper problem's hypergradient at the initial state or after N outer steps, without a run"


def add_command(command) -> None:
    """Register `hypergrad` on the CLI's subparser factory."""
    p = command("hypergrad", HELP, cmd_hypergrad)
    p.add_argument("file", metavar="FILE", help="the .mlo program")
    p.add_argument("--after", type=int, default=0, metavar="N",
                   help="train N outer steps first (the program's schedule, nothing written), then compute "
                        "the hypergradients at that state, on the batches the last steps drew (default 0: the "
                        "initial state, on the first batches)")
    p.add_argument("--json", action="store_true", help="print the full values as JSON")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="cast the modules and every floating batch to this dtype; default: as the program builds them")
    p.add_argument("--seed", type=int, help="random seed; default: the train block's")
    p.add_argument("--check", action="store_true",
                   help="compare with the hypergradients at the same state with every edge that does not unroll "
                        "solved by CG to convergence (relative error per upper problem)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="change a field (PROBLEM.FIELD, UPPER->LOWER.FIELD, train.FIELD, a setting) or one "
                        "argument of a call (PROBLEM.optimizer.lr) for this computation; all are applied "
                        "together and checked like the file (repeatable)")


def cmd_hypergrad(args, out: Output) -> int:
    if args.after < 0:
        raise UsageError(f"--after must be at least 0, got {args.after}",
                         help="--after N computes the hypergradients after N outer steps; 0 is the initial state")
    compiled = _compiled(args, out)
    if compiled is None:
        return EXIT_ERRORS
    from mloc.runtime.engine import RunConfig
    from mloc.runtime.launch import build
    from mloc.runtime.metrics import NonFiniteError
    ns = load_generated(compiled.source, str(Path(args.file).resolve().with_suffix(".generated.py")))
    base: RunConfig = ns["DEFAULTS"]
    config = replace(base, seed=args.seed if args.seed is not None else base.seed, device="cpu", dtype=args.dtype)
    program = build(ns, config)
    try:
        trained(program, args.after)
        state = _state(program) if args.check else None
        grads = program.hypergradients()
    except NonFiniteError as e:
        cause = f"\n  = note: {e.note}" if e.note else ""
        out.err(f"error: {e}, within the {args.after} steps of --after{cause}\n  = help: {e.help}")
        return EXIT_ERRORS
    finally:
        program.close()
    errors, curvature = _reference_errors(ns, config, compiled, grads, state) if args.check else ({}, [])
    _print(out, args, grads, errors)
    if args.check:      # after the values: on stdout, or on stderr beside --json's one object
        for line in _verdict(errors, curvature, config.dtype or "float32"):
            (out.err if args.json else out.out)(line)
    return EXIT_OK


def trained(program, steps: int) -> None:
    """`steps` outer steps of `program`'s schedule, then its finiteness check (as the Python
    API's `Session.run`; raises NonFiniteError)."""
    for _ in range(steps):
        program.outer_step()
    program.guard.check()


def _state(program) -> tuple[dict, dict]:
    """What a hypergradient at this moment depends on: the training state and the batches
    the problems hold (restoring a state drops them)."""
    return program.state_dict(), {name: lv.batch for name, lv in program.live.items()}


def _print(out: Output, args, grads: dict, errors: dict[str, float]) -> None:
    if args.json:
        out.out(json.dumps({up: {k: v.tolist() for k, v in g.items()} | (
            {"_relative_error": errors[up]} if up in errors else {}) for up, g in grads.items()}))
        return
    if args.after:
        out.out(f"after {args.after} outer step{'s' * (args.after != 1)}:")
    for up, g in grads.items():
        out.out(f"{up}:")
        for k, v in g.items():
            out.out(f"  {k:<40} norm {float(v.norm()):.6e}  shape {list(v.shape)}")
        if up in errors:
            out.out(f"  relative error against CG to convergence: {errors[up]:.3e}")


AGREE, CLOSE = 1e-3, 1e-1      # relative error: the method agrees with the reference / approximates it


def _verdict(errors: dict[str, float], curvature: list, dtype: str) -> list[str]:
    """What `--check` concludes: one line per lower problem whose Hessian is not positive
    definite (the reference is then meaningless), then the verdict line."""
    rtol = 1e-8 if dtype == "float64" else 1e-4
    bad = [c for c in curvature if c.indefinite(rtol)]
    lines = []
    for c in curvature:
        how = (f"exact spectrum of its {c.size} parameters" if c.exact else
               f"probed with Hessian-vector products over {c.size} parameters")
        lines.append(f"lower `{c.problem}`: Hessian eigenvalues in [{c.lam_min:.3e}, {c.lam_max:.3e}] ({how})")
    for c in bad:
        measure = "lambda_min" if c.exact else "v'Hv/v'v along a probed direction"
        lines.append(f"note: the Hessian of `{c.problem}`'s loss has negative curvature here "
                     f"({measure} = {c.lam_min:.3e}): its loss "
                     "is not locally convex, so 'CG to convergence' solves an indefinite system and is no "
                     "reference; the relative errors above are meaningless for the problems above it")
    if bad:
        lines.append(f"verdict: no verdict: the CG reference is meaningless (non-convex lower problem: "
                     f"{', '.join(f'`{c.problem}`' for c in bad)})")
    elif not errors:
        lines.append("verdict: nothing to compare (no upper problem)")
    else:
        worst_up = max(errors, key=errors.get)
        worst = errors[worst_up]
        word = ("agrees with" if worst <= AGREE else "approximates" if worst <= CLOSE else "differs from")
        lines.append(f"verdict: {word} the CG reference: {worst:.3e} at worst, relatively (`{worst_up}`; "
                     f"agrees <= {AGREE:g}, approximates <= {CLOSE:g})")
    return lines


def _reference_errors(ns: dict, config, compiled: Compiled, grads: dict,
                      state: tuple[dict, dict]) -> tuple[dict[str, float], list]:
    """Relative error of each upper's hypergradient against the same program, at the same
    state and batches, with every edge whose method does not unroll (`caps.unrolls`, as
    planned) solved by CG to convergence: 2·d iterations for a lower problem with d
    parameters (as the trace counted them) (CG is exact after d in exact arithmetic; the
    runtime masks converged steps rather than stopping, so the count is bounded), at most 1000.
    Also the curvature of each such edge's lower problem there (`mloc.runtime.curvature`):
    CG's answer is a reference only where that Hessian is positive definite."""
    from mloc.builtins import METHODS
    from mloc.runtime import Edge, cg
    from mloc.runtime.curvature import lower_curvature
    from mloc.runtime.launch import build

    unrolled = {(e.upper, e.lower) for e in compiled.plan.edges if METHODS[e.method].caps.unrolls}
    sizes = compiled.sizes.params

    def reference(e):
        if (e.upper, e.lower) in unrolled:
            return e
        return Edge(e.upper, e.lower, cg(iters=min(2 * sizes[e.lower], 1000), tol=1e-14))

    # other methods, other compositions: the runtime composes them itself
    program = build({**ns, "EDGES": tuple(reference(e) for e in ns["EDGES"]), "COMPOSITION": None}, config)
    try:
        saved, batches = state
        program.load_state_dict(saved)
        for name, batch in batches.items():
            program.live[name].batch = batch
        ref = program.hypergradients()
        lowers = sorted({e.lower for e in ns["EDGES"] if (e.upper, e.lower) not in unrolled})
        curvature = [lower_curvature(program, name) for name in lowers]
    finally:
        program.close()
    out = {}
    for up, g in grads.items():
        num = math.sqrt(sum(float((g[k] - ref[up][k]).pow(2).sum()) for k in g))
        den = math.sqrt(sum(float(ref[up][k].pow(2).sum()) for k in g)) or 1.0
        out[up] = num / den
    return out, curvature
