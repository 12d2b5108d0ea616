"""What the documentation and mloc's docstrings cite is in the repository: a path into it
names a file that exists, and nothing points at a reference outside it (the developers'
`shared/` notes are not shipped: cite the paper, or the file in docs/)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

SOURCES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "mloc").rglob("*.py")])
_PATH = re.compile(r"(?<![\w./-])((?:mloc|tests|docs|bench|programs|grammar)/[\w./-]*\w\.(?:py|md|mlo|lark|png))\b")
_OUTSIDE = re.compile(r"(?<![\w./-])(?:\.\./)?shared/[\w./-]+")
NOT_FILES = {"programs/bad.mlo",            # the file of an example diagnostic (README)
             "mloc/_grammar/mloc.lark"}     # written into the wheel when it is built


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_files_exist_in_the_repository(path):
    text = path.read_text(encoding="utf-8")
    outside = _OUTSIDE.findall(text)
    assert not outside, f"{path.relative_to(ROOT)} cites {outside}, which the repository does not hold"
    missing = sorted({m for m in _PATH.findall(text) if not (ROOT / m).exists()} - NOT_FILES)
    assert not missing, f"{path.relative_to(ROOT)} cites files that do not exist: {missing}"
