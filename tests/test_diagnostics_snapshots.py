"""The full rendered text of a few representative bad programs, pinned.

Each `tests/diagnostics/snapshots/<case>.txt` holds exactly what
`mloc check --color never tests/diagnostics/<case>.mlo` writes to stderr when run from the
repository root. Set MLOC_ACCEPT=1 to rewrite the snapshots instead of comparing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mloc.cli import EXIT_ERRORS, main
from mloc.env import read_env

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "diagnostics" / "snapshots"
CASES = sorted(p.stem for p in SNAPSHOTS.glob("*.txt"))


def test_there_are_snapshots():
    assert len(CASES) >= 5


@pytest.mark.parametrize("case", CASES)
def test_rendered_diagnostics_match_snapshot(case, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)                 # paths in the output are relative to the root
    monkeypatch.delenv("NO_COLOR", raising=False)
    program = f"tests/diagnostics/{case}.mlo"
    assert (ROOT / program).is_file(), f"snapshot {case}.txt has no program {program}"
    status = main(["check", "--color", "never", program])
    captured = capsys.readouterr()
    assert captured.out == ""
    snapshot = SNAPSHOTS / f"{case}.txt"
    if read_env().accept:
        snapshot.write_text(captured.err, encoding="utf-8")
        return
    assert captured.err == snapshot.read_text(encoding="utf-8")
    assert status == EXIT_ERRORS
