"""The slow tier applies here too when these tests run on their own (tests/run/conftest.py
defines it; loading it twice only marks a slow test skipped twice)."""

from tests.run.conftest import pytest_collection_modifyitems, pytest_configure  # noqa: F401
