"""docs/language.md documents every field, built-in and argument the checker knows."""

from __future__ import annotations

from mloc.builtins import TABLES
from mloc.lang import vocabulary as V
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")


def test_every_field_is_documented():
    for table in (V.PROBLEM_FIELDS, V.EDGE_FIELDS, V.CHAIN_FIELDS, V.TRAIN_FIELDS, V.SETTINGS):
        for name in table:
            assert f"`{name}`" in DOC, name
    for kind in V.TRAIN_EVERY:
        assert f"`{kind} every N" in DOC, kind


def test_every_builtin_and_argument_is_documented():
    for table in TABLES.values():
        for descriptor in table.values():
            sig = descriptor.signature
            assert f"`{sig.name}`" in DOC, sig.name
            for p in sig.params:
                assert f"`{p.name}`" in DOC, f"{sig.name}.{p.name}"


def test_every_choice_is_documented():
    for choice in V.PRECISIONS + V.SEMANTICS + V.ITD_MODES:
        assert f"`{choice}`" in DOC, choice
