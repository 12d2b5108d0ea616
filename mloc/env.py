"""The one place that reads environment variables.

    MLOC_DEBUG=1   show Python tracebacks for internal errors (exit code 101)
    MLOC_ACCEPT=1  let tests rewrite golden files instead of comparing with them
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


def read_env() -> Env:
    return Env(debug=_flag("MLOC_DEBUG"), accept=_flag("MLOC_ACCEPT"), no_color="NO_COLOR" in os.environ)
