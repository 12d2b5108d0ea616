"""The slow tier's marker, as in tests/run (``--nproc`` runs are slow: select with -m slow)."""

from tests.run.conftest import pytest_collection_modifyitems, pytest_configure  # noqa: F401
