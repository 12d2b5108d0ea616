"""The Meta-Weight-Net example's module, re-exported for the equivalence programs.

The `.mlo` files here import this module (mloc looks beside the `.mlo` first); it puts
`programs/` on `sys.path` and re-exports `programs/reweighting.py`, so the test runs the
example's own model classes, data and losses, not a copy.
"""

import sys
from pathlib import Path

_PROGRAMS = str(Path(__file__).resolve().parents[2] / "programs")
if _PROGRAMS not in sys.path:
    sys.path.insert(0, _PROGRAMS)

from reweighting import *  # noqa: E402,F401,F403
