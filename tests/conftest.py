"""Shared test helpers: golden files and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from mloc.env import read_env

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "programs"
GOLDEN = Path(__file__).resolve().parent / "golden"


def assert_golden(name: str, text: str) -> None:
    """Compare `text` with tests/golden/NAME; MLOC_ACCEPT=1 rewrites it instead (never in CI)."""
    path = GOLDEN / name
    if read_env().accept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"missing golden file {path}; run the tests once with MLOC_ACCEPT=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


@pytest.fixture
def golden():
    return assert_golden
