"""The fault matrix runs only when asked for (`make test-chaos`, or LONGRUN_CHAOS=1): each cell is a full
drill with a component killed in the middle, minutes each, too long for `make test`'s 60-minute budget.

A cell passes only through its verdict line (tests/chaos/verdict.py): an interrupted or incomplete cell
fails, or is listed at the end as having no result."""

from __future__ import annotations

import os

import pytest

from .verdict import cell_done, register

__all__ = ["cell_done"]


def pytest_configure(config: pytest.Config) -> None:
    register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("LONGRUN_CHAOS") == "1":
        return
    skip = pytest.mark.skip(reason="the fault matrix runs with `make test-chaos` (LONGRUN_CHAOS=1)")
    for item in items:
        # the marker, not the keyword: every test under tests/chaos/ has "chaos" (the package) as keyword
        if item.get_closest_marker("chaos") is not None:
            item.add_marker(skip)
