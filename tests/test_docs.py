"""docs/language.md documents every field, built-in and argument the checker knows;
docs/architecture.md names the pipeline's passes and the registries as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

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


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_architecture_pages_pass_list_and_table_are_the_pipeline():
    """docs/architecture.md's diagram and pass table name the pipeline's passes, in order."""
    from mloc.codegen.compile import PIPELINE
    names = [p.name for p in PIPELINE]
    section = ARCHITECTURE.split("## The compile: one pass list", 1)[1].split("\n## ", 1)[0]
    diagram = section.split("```")[1]
    drawn = [w for line in diagram.splitlines() for w in re.findall(r"[a-z]+", re.split(r"\s{3,}[A-Z]", line)[0])]
    assert drawn == names
    table = re.findall(r"^\| ([a-z]+) \| .+ \| `mloc/.+\|$", section, re.M)
    assert table == names


def test_the_architecture_page_names_every_registry():
    """Its registries are `TABLES`' (one file each, in mloc/builtins/), no more, no fewer."""
    import sys
    files = {Path(sys.modules[_defined_in(name)].__file__).name for name in TABLES}
    said = re.search(r"Registries \(`mloc/builtins/(\w+\.py)`, `(\w+\.py)`, `(\w+\.py)`\)", ARCHITECTURE)
    assert said and set(said.groups()) == files


def _defined_in(table: str) -> str:
    """The module of mloc.builtins that defines the registry `table` (its name, upper-cased)."""
    import importlib
    module = importlib.import_module(f"mloc.builtins.{table}")
    assert getattr(module, table.upper()) is TABLES[table]
    return module.__name__
