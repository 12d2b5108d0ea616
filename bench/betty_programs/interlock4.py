"""programs/interlock4.mlo (four stages on scikit-learn's digits, ``interlock = 2``) and Betty:
as interlock.py says, Betty has no interlocking chain to express it with."""

from __future__ import annotations

from betty_programs.interlock import BETTY, METHOD, evidence  # noqa: F401  (the same reason)

PROGRAM = "interlock4"
