"""Betty 0.2.1's version of each program in ``programs/``: one module per program, one row of
``bench/programs_vs_betty.py``'s table each. Adding a program's row is adding one module here.

The interface, module-level names (``common.Row`` documents each field again):

``PROGRAM``
    the program's file stem: ``programs/<PROGRAM>.mlo``.
``BETTY``
    ``None`` when Betty can express the program; otherwise the one-line reason (the Betty
    API point), and the row shows :func:`evidence` instead of measurements.
``METHOD``
    one line: how mloc's hypergradient maps to Betty's ``Config(type=...)``, and where they
    differ.
``UPPERS``
    the problems whose first hypergradient is compared (``()`` for a one-level program).
``AGREE``
    ``--set`` overrides that make one outer step of each upper problem plain SGD with rate
    1 (so ``θ₀ − θ₁`` is its hypergradient) and switch off anything else that rescales it
    (clipping); Betty's :func:`build` does the same when called with ``agree=True``.
``CHECKS``
    the first-step comparisons, each ``common.Check(label, mloc_set, betty_config, same)``:
    extra mloc ``--set`` (the edge's method), the Betty ``Config`` fields of the lower
    problem(s) for the same method, and ``same``: whether the two are the same computation
    (then ``tests/test_betty_programs.py`` holds them to a float64 tolerance) or the check
    is evidence of a difference (Betty's bug or another formula, said in ``label``).
``METRIC``
    the label of the program's evaluation whose final value is the row's metric (as
    ``mloc sweep`` tabulates it), with ``metric(modules)`` computing the same on Betty's.
``BIGGER``
    ``"max"`` or ``"min"``: which way the metric is better (for the reading only).
``SEED_STEPS``
    the outer steps of the 3-seed runs: the program's own, or fewer (then the table says so).
``TINY``
    ``--set`` overrides that make the program small (module sizes only: Betty's side takes
    mloc's modules, so it follows) for the default-tier test.
``build(modules, *, dtype, agree, lower, steps) -> common.BettyProgram``
    Betty's program around deep copies of ``modules`` (``{problem: nn.Module}``, mloc's
    initial modules), batches cast to ``dtype``; ``lower``: Config fields for the lower
    problem(s) (a check's, or ``{}`` for the program as written); ``steps``: the run's
    outer steps (schedules' lengths). ``.step()`` is one outer step as mloc counts them.
``metric(modules) -> float``
    the program's ``METRIC`` evaluation on ``{problem: module}`` (eval mode, no grad).
``evidence() -> list[tuple[str, str]]``
    for rows Betty cannot express or gets wrong beyond the checks: measured facts, each
    (what, value).

Betty is an optional benchmark dependency (peers.md says how it is installed), never mloc's.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

__all__ = ["names", "row"]

_ROOT = Path(__file__).resolve().parents[2]
for _p in (_ROOT / "programs", _ROOT / "bench"):   # the programs' modules (lib.*), the bench's
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def names() -> list[str]:
    """Every builder module here, in the table's order (alphabetical)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common")


def row(name: str):
    """The builder module of program ``name``."""
    if name not in names():
        raise KeyError(f"no Betty builder for {name!r}; there are: {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}")
