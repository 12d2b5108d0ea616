"""The one place that reads environment variables.

    MLOC_DEBUG=1   show Python tracebacks for internal errors (exit code 101)
    MLOC_ACCEPT=1  let tests rewrite golden files instead of comparing with them
    MLOC_TEST_DEADLINE=T  (seconds since the epoch) skip the tests not started by then:
                   .ci/run's time budget for the slow tier (tests/conftest.py)
    NO_COLOR       disable colored output (https://no-color.org)
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class Env:
    debug: bool
    accept: bool
    no_color: bool
    test_deadline: float | None = None


def read_env() -> Env:
    deadline = os.environ.get("MLOC_TEST_DEADLINE", "").strip()
    try:
        test_deadline = float(deadline) if deadline else None
    except ValueError:
        test_deadline = None
    return Env(debug=_flag("MLOC_DEBUG"), accept=_flag("MLOC_ACCEPT"), no_color="NO_COLOR" in os.environ,
               test_deadline=test_deadline)
