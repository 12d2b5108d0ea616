"""The slow tier of tests/run applies here too (``-m slow`` selects the pipeline tests)."""

from tests.run.conftest import pytest_collection_modifyitems, pytest_configure  # noqa: F401
