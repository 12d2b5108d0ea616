"""The slow tier: tests marked ``slow`` (long fault injection, many processes) run only
when the marker is selected: ``python -m pytest -m slow`` (those alone) or
``-m "slow or not slow"`` (everything). The default run skips them."""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long fault-injection and multi-process cases; select with -m slow")


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow tier: select with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
