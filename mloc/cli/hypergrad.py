"""`mloc hypergrad FILE [--after N]`: each upper problem's hypergradient, without a training run.

At the initial state, or (`--after N`) after N outer steps of the program's own schedule:
the state `mloc.load(FILE).run(N)` reaches, on the batches its last steps drew (a problem
with no batch yet draws its first), so the values equal the Python API's
`hypergradients()` there bit for bit. Nothing is written. `--json` prints every value,
`--dtype float64` computes in double precision, and `--check` compares each hypergradient
with the same state's hypergradient when every edge that does not unroll is solved by CG to
convergence.
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
        out.err(f"error: {e}, within the {args.after} steps of --after\n  = help: {e.help}")
        return EXIT_ERRORS
    finally:
        program.close()
    errors = _reference_errors(ns, config, compiled, grads, state) if args.check else {}
    _print(out, args, grads, errors)
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


def _reference_errors(ns: dict, config, compiled: Compiled, grads: dict, state: tuple[dict, dict]) -> dict[str, float]:
    """Relative error of each upper's hypergradient against the same program, at the same
    state and batches, with every edge whose method does not unroll (`caps.unrolls`, as
    planned) solved by CG to convergence: 2·d iterations for a lower problem with d
    parameters (as the trace counted them) (CG is exact after d in exact arithmetic; the
    runtime masks converged steps rather than stopping, so the count is bounded), at most 1000."""
    from mloc.builtins import METHODS
    from mloc.runtime import Edge, cg
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
    finally:
        program.close()
    out = {}
    for up, g in grads.items():
        num = math.sqrt(sum(float((g[k] - ref[up][k]).pow(2).sum()) for k in g))
        den = math.sqrt(sum(float(ref[up][k].pow(2).sum()) for k in g)) or 1.0
        out[up] = num / den
    return out
