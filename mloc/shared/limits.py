"""mloc's bounds on the numbers that decide how long a run is, and on seeds: one home for
the checker (a field's type, E305), the command line (`--steps`, `--seed`: exit 2) and
`python train.py`. Torch-free, import-free: the runtime shares it.

A count that the range of its field allows but no run could finish is refused with the
bound and why, rather than accepted and left to run for ages (issue 23: `unroll = 10**20`).

    MAX_STEPS    10^9       a count over the whole run: `steps`, `--steps`, `warmup`, an
                            interval (`log every N`), a patience, a schedule's length; and
                            the bound of every other integer the language reads for itself
                            (`Int`'s default; the user's own calls get their integers as written, E006's 64 bits aside)
    MAX_REPEATS  10^6       a count repeated inside every outer step: an edge's `unroll`, a
                            problem's `accumulate`, a method's `iters`, `itd(steps, truncate)`
    MAX_SEED     2^63 - 1   seeds are 0 .. 2^63 - 1: a signed 64-bit integer, which torch's
                            generators, NumPy and the data samplers (`seed + epoch`) all take
"""

from __future__ import annotations

MAX_STEPS = 10**9
MAX_REPEATS = 10**6
MAX_SEED = 2**63 - 1

WHY_STEPS = "mloc's bound on a count over the whole run (a billion steps: 11 days at a millisecond a step)"
WHY_REPEATS = "mloc's bound on a count repeated in every outer step"
WHY_SEED = "the largest seed, a signed 64-bit integer (as torch's generators and NumPy take it)"


FLAGS = {"--steps": (1, MAX_STEPS, WHY_STEPS), "--after": (0, MAX_STEPS, WHY_STEPS),
         "--seed": (0, MAX_SEED, WHY_SEED), "--seeds": (0, MAX_SEED, WHY_SEED)}
"""The command-line integers bounded here: (lowest, highest, why the highest)."""


def flag_error(flag: str, value: int | None) -> str | None:
    """The usage error of `flag` (one of :data:`FLAGS`) given `value` outside its bounds;
    None when it is inside or not given."""
    lo, hi, why = FLAGS[flag]
    if value is None or lo <= value <= hi:
        return None
    if value < lo:
        return f"{flag} must be at least {lo}, got {value}"
    return f"{flag} must be at most {hi}, got {value}: {hi} is {why}"
