"""Shared test helpers: golden files and paths; and the slow tier.

The slow tier: tests marked ``slow`` (long fault injection, many processes, every
registry entry where the default tier runs a few) run only when the marker is selected:
``python -m pytest -m slow`` (those alone) or ``-m "slow or not slow"`` (everything). The
default run skips them. Here, at the root, so that a slow test is skipped wherever it
lives and however the suite is narrowed (``pytest tests/test_run.py``).

A time budget: with ``MLOC_TEST_DEADLINE`` (seconds since the epoch; ``.ci/run`` sets it for
the slow tier so that CI ends inside its limit) a test not started by then is skipped, and
says so, rather than the whole run being cut off."""

from __future__ import annotations

import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Ran:
    """What `mloc ARGV` did: its exit status and what it printed (a CompletedProcess's fields)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def mloc_here(capsys):
    """`mloc ARGV` in this process: `mloc.cli.main`, stdout and stderr captured. For tests
    of what a command does, not of processes (signals, kills, locks, workers use a child
    process): each child pays torch's import and first trace again, seconds each."""
    from mloc.cli import main

    def run(*argv) -> Ran:
        capsys.readouterr()
        status = main([str(a) for a in argv])
        out = capsys.readouterr()
        return Ran(status, out.out, out.err)
    return run


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long fault-injection and multi-process cases; select with -m slow")


def pytest_runtest_setup(item):
    deadline = read_env().test_deadline
    if deadline is not None and time.time() > deadline:
        pytest.skip("the time budget (MLOC_TEST_DEADLINE, set by .ci/run) was spent before this test started")


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow tier: select with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
