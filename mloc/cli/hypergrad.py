"""`mloc hypergrad FILE [--after N]`: each upper problem's hypergradient, without a training run.

At the initial state, or (`--after N`) after N outer steps of the program's own schedule:
the state `mloc.load(FILE).run(N)` reaches, on the batches its last steps drew (a problem
with no batch yet draws its first), so the values equal the Python API's
`hypergradients()` there bit for bit. Nothing is written. `--json` prints every value,
`--dtype float64` computes in double precision, and `--check` compares each hypergradient
with the same state's hypergradient when every edge is solved by CG to convergence (an
independent reference, `itd` edges included; none exists for a MAML-style `init` edge, and
the check says so), reports the curvature of those edges' lower problems (where one is not
positive definite, CG's answer is no reference) and ends with a verdict line. An error in
the program's code is E702 (exit 1), as under `mloc run`; E900 (101) is mloc's own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from mloc.cli.output import EXIT_ERRORS, EXIT_OK, Output, UsageError, within_limits
from mloc.cli.train import _compiled
from mloc.codegen.compile import Compiled, load_generated

NOTHING_WRITTEN = "`mloc hypergrad` writes nothing"
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
                   help="compare with the hypergradients at the same state with every edge solved by CG to "
                        "convergence (relative error per upper problem)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="change a field (PROBLEM.FIELD, UPPER->LOWER.FIELD, train.FIELD, a setting) or one "
                        "argument of a call (PROBLEM.optimizer.lr) for this computation; all are applied "
                        "together and checked like the file (repeatable)")


def cmd_hypergrad(args, out: Output) -> int:
    if args.after < 0:
        raise UsageError(f"--after must be at least 0, got {args.after}",
                         help="--after N computes the hypergradients after N outer steps; 0 is the initial state")
    within_limits(after=args.after, seed=args.seed)
    compiled = _compiled(args, out)
    if compiled is None:
        return EXIT_ERRORS
    from mloc.runtime.program.engine import RunConfig
    from mloc.runtime.processes.launch import build
    from mloc.runtime.base.usercode import user_error
    from mloc.runtime.grad.finite import NonFiniteError
    declaration = load_generated(compiled.source, str(Path(args.file).resolve().with_suffix(".generated.py")))
    base: RunConfig = declaration.defaults
    config = replace(base, seed=args.seed if args.seed is not None else base.seed, device="cpu", dtype=args.dtype)
    # the program's own code raising is E702 (exit 1), as under `mloc run`; mloc's is E900
    try:
        program = build(declaration, config)
    except Exception as err:  # noqa: BLE001 - user code raising while the program is built
        return user_error(err, "building the program", config.dtype, after=NOTHING_WRITTEN)
    where = Doing("the first step of --after" if args.after else "the hypergradients")
    try:
        trained(program, args.after, where)
        state = _state(program) if args.check else None
        where.text = "the hypergradients" + (f" after {args.after} steps" if args.after else "")
        grads = program.hypergradients()
        if args.check:
            where.text = "the CG reference of --check"
            check = _reference_errors(declaration, config, compiled, grads, state)
        else:
            check = Check({}, [], {}, [])
    except NonFiniteError as e:
        cause = f"\n  = note: {e.note}" if e.note else ""
        out.err(f"error: {e}, within the {args.after} steps of --after{cause}\n  = help: {e.help}")
        return EXIT_ERRORS
    except Exception as err:  # noqa: BLE001 - re-raised (E900) unless the program's code raised it
        return user_error(err, where.text, config.dtype, program.device, after=NOTHING_WRITTEN)
    finally:
        program.close()
    _print(out, args, grads, check)
    if args.check:      # after the values: on stdout, or on stderr beside --json's one object
        for line in check.notes + _verdict(check, config.dtype or "float32"):
            (out.err if args.json else out.out)(line)
    return EXIT_OK


class Doing:
    """What `mloc hypergrad` is computing, for an error in the program's code (E702)."""

    def __init__(self, text: str):
        self.text = text


def trained(program, steps: int, where: Doing | None = None) -> None:
    """`steps` outer steps of `program`'s schedule, then its finiteness check (as the Python
    API's `Session.run`; raises NonFiniteError). `where` is kept at the step being taken."""
    for k in range(steps):
        if where is not None:
            where.text = f"step {k + 1} of --after {steps}"
        program.outer_step()
    program.guard.check()


def _state(program) -> tuple[dict, dict]:
    """What a hypergradient at this moment depends on: the training state and the batches
    the problems hold (restoring a state drops them)."""
    return program.state_dict(), {name: lv.batch for name, lv in program.live.items()}


def _print(out: Output, args, grads: dict, check: "Check") -> None:
    errors = check.errors
    if args.json:
        out.out(json.dumps({up: {k: v.tolist() for k, v in g.items()} | (
            {"_relative_error": errors[up]} if up in errors else {}) | (
            {"_no_reference": check.unreferenced[up]} if up in check.unreferenced else {})
            for up, g in grads.items()}))
        return
    if args.after:
        out.out(f"after {args.after} outer step{'s' * (args.after != 1)}:")
    for up, g in grads.items():
        out.out(f"{up}:")
        for k, v in g.items():
            out.out(f"  {k:<40} norm {float(v.norm()):.6e}  shape {list(v.shape)}")
        if up in errors:
            out.out(f"  relative error against CG to convergence: {errors[up]:.3e}")
        elif up in check.unreferenced:
            out.out(f"  no reference: {check.unreferenced[up]}")


AGREE, CLOSE = 1e-3, 1e-1      # relative error: the method agrees with the reference / approximates it


def _verdict(check: "Check", dtype: str) -> list[str]:
    """What `--check` concludes: one line per lower problem whose Hessian is not positive
    definite (the reference is then meaningless), then the verdict line."""
    errors, curvature = check.errors, check.curvature
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
    elif not errors and check.unreferenced:
        lines.append(f"verdict: no verdict: no reference applies to "
                     f"{', '.join(f'`{u}`' for u in check.unreferenced)} (see above)")
    elif not errors:
        lines.append("verdict: nothing to compare (no upper problem)")
    else:
        worst_up = max(errors, key=errors.get)
        worst = errors[worst_up]
        word = ("agrees with" if worst <= AGREE else "approximates" if worst <= CLOSE else "differs from")
        lines.append(f"verdict: {word} the CG reference: {worst:.3e} at worst, relatively (`{worst_up}`; "
                     f"agrees <= {AGREE:g}, approximates <= {CLOSE:g})")
    return lines


@dataclass(frozen=True)
class Check:
    """What `--check` found: the relative error of each upper problem that has a reference,
    the curvature of the lower problems solved by CG there, the upper problems no reference
    applies to (why, in words), and notes on what the reference of an unrolled edge means."""

    errors: dict[str, float]
    curvature: list
    unreferenced: dict[str, str]
    notes: list[str]


def _reference_errors(declaration, config, compiled: Compiled, grads: dict, state: tuple[dict, dict]) -> Check:
    """Relative error of each upper's hypergradient against the same program, at the same
    state and batches, with every edge solved by CG to convergence: the implicit-function
    hypergradient ``-J_xᵀ H⁻¹ v`` at the current point, independent of the method checked.
    2·d iterations for a lower problem with d parameters (as the trace counted them) (CG is
    exact after d in exact arithmetic; the runtime masks converged steps rather than
    stopping, so the count is bounded), at most 1000.

    An unrolled edge (``itd``) is compared with it too: ``itd`` is the exact derivative of
    its K unrolled steps, which approaches the implicit one as the lower problem converges,
    so the error measures that distance (a note says so). No implicit reference exists for
    an edge into a lower problem that starts from its upper's parameters (``init``, MAML):
    the lower's loss does not read the upper, its solution depends on it only through the
    starting point; the uppers above such an edge get no error, and a line says why.

    Also the curvature of each CG-solved lower problem there (`mloc.runtime.grad.curvature`):
    CG's answer is a reference only where that Hessian is positive definite."""
    from mloc.builtins import METHODS
    from mloc.runtime import Edge, cg
    from mloc.runtime.grad.curvature import lower_curvature
    from mloc.runtime.processes.launch import build

    specs = {spec.name: spec for spec in declaration.problems}
    starts = {(e.upper, e.lower) for e in compiled.plan.edges
              if specs[e.lower].init == e.upper and e.upper not in specs[e.lower].reads}
    unrolled = [(e.upper, e.lower) for e in compiled.plan.edges
                if METHODS[e.method].caps.unrolls and (e.upper, e.lower) not in starts]
    sizes = compiled.sizes.params

    def reference(e):
        if (e.upper, e.lower) in starts:
            return e
        return Edge(e.upper, e.lower, cg(iters=min(2 * sizes[e.lower], 1000), tol=1e-14))

    unreferenced = _unreferenced(grads, starts, _below(declaration.edges))
    notes = [f"note: `{u} -> {lo}` unrolls (itd): its reference is the implicit hypergradient at the current "
             f"point (CG to convergence), which the unrolled derivative approaches only as `{lo}` converges; "
             "the error measures that distance" for u, lo in unrolled]

    program = build(_recomposed(declaration, tuple(reference(e) for e in declaration.edges)), config)
    try:
        saved, batches = state
        program.load_state_dict(saved)
        for name, batch in batches.items():
            program.live[name].batch = batch
        ref = program.hypergradients()
        lowers = sorted({e.lower for e in declaration.edges if (e.upper, e.lower) not in starts})
        curvature = [lower_curvature(program, name) for name in lowers]
    finally:
        program.close()
    out = {}
    for up, g in grads.items():
        if up in unreferenced:
            continue
        num = math.sqrt(sum(float((g[k] - ref[up][k]).pow(2).sum()) for k in g))
        den = math.sqrt(sum(float(ref[up][k].pow(2).sum()) for k in g)) or 1.0
        out[up] = num / den
    return Check(out, curvature, unreferenced, notes)


def _recomposed(declaration, edges):
    """`declaration` with other `edges` (other methods), so other compositions: composed
    as the planner composes them."""
    from mloc.ir.composition import compositions_of
    compositions = compositions_of(declaration.problems, edges, declaration.semantics)
    return replace(declaration, edges=edges, compositions=compositions)


def _unreferenced(grads: dict, starts: set, below: dict[str, set[str]]) -> dict[str, str]:
    """For each upper above an edge into a lower problem that starts from its upper's
    parameters (``starts``: ``init``, MAML), why no implicit reference applies to it."""
    out = {}
    for up in grads:
        cut = sorted((u, lo) for u, lo in starts if u == up or u in below.get(up, ()))
        if cut:
            out[up] = (
                "; ".join(f"`{lo}` starts from `{u}`'s parameters (init), and its loss does not read them"
                          for u, lo in cut)
                + ": the lower solution depends on them only through its starting point, so no implicit "
                  "(CG) hypergradient exists to compare with; itd is the exact derivative of the unrolled steps")
    return out


def _below(edges) -> dict[str, set[str]]:
    """Every problem below each upper (transitively), from the hierarchy edges."""
    lowers: dict[str, set[str]] = {}
    for e in edges:
        lowers.setdefault(e.upper, set()).add(e.lower)
    out = {}
    for up in lowers:
        seen, todo = set(), list(lowers[up])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += lowers.get(n, ())
        out[up] = seen
    return out
