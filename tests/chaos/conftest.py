"""The fault matrix runs only when asked for: each cell is a full drill with a component killed in the
middle, minutes each, too long for all 70 in `make test`'s 60-minute budget.

- LONGRUN_CHAOS=1 (`make test-chaos`): every chaos test, all 70 cells.
- LONGRUN_CHAOS=rotate: only this commit's two cells of the matrix (tests/chaos/rotation.py: chosen from
  `git rev-list --count HEAD`, so every cell runs once in any 35 consecutive commits); the other cells and
  the other chaos tests are skipped. This is the switch that would put the matrix into the default suite;
  scripts/test.sh does not set it (yet): whoever owns the suite's time decides.
- unset (or anything else): every chaos test is skipped.

Each cell that runs writes its artefact (tests/chaos/artefact.py) to docs/reliability/cells/.

A cell passes only through its verdict line (tests/chaos/verdict.py): an interrupted or incomplete cell
fails, or is listed at the end as having no result."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.drill_fixtures import env, rest

from . import rotation
from .artefact import ROOT
from .verdict import cell_done, register

__all__ = ["cell_done", "env", "rest"]


def pytest_configure(config: pytest.Config) -> None:
    register(config)


def _cell_of(item: pytest.Item) -> tuple[str, str] | None:
    """(step, component) of a matrix cell, None for any other test."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "step" in params and "component" in params:
        return str(params["step"]), str(params["component"])
    return None


def rotation_skips(
    mode: str | None, cells: list[tuple[str, str] | None], root: Path = ROOT
) -> tuple[list[bool], str]:
    """For each chaos test (its matrix cell, or None), whether it is skipped in `mode`, and the reason.
    Raises CalledProcessError when `rotate` cannot read `root`'s commit (it must not silently run nothing)."""
    if mode == "1":
        return [False] * len(cells), ""
    if mode != "rotate":
        return [True] * len(cells), "the fault matrix runs with `make test-chaos` (LONGRUN_CHAOS=1)"
    index, how = rotation.commit_index(root)
    chosen = rotation.cells_for(index)
    names = ", ".join(f"{s} x {c}" for s, c in chosen)
    why = f"not in this commit's rotation ({how}: {names}); LONGRUN_CHAOS=1 runs every cell"
    return [cell not in chosen for cell in cells], why


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the marker, not the keyword: every test under tests/chaos/ has "chaos" (the package) as keyword
    chaos = [item for item in items if item.get_closest_marker("chaos") is not None]
    if not chaos:
        return
    try:
        skipped, why = rotation_skips(os.environ.get("LONGRUN_CHAOS"), [_cell_of(i) for i in chaos])
    except (OSError, subprocess.CalledProcessError) as e:
        raise pytest.UsageError(f"LONGRUN_CHAOS=rotate needs the commit (git): {e}") from e
    skip = pytest.mark.skip(reason=why)
    for item, off in zip(chaos, skipped, strict=True):
        if off:
            item.add_marker(skip)
