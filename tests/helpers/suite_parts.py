"""The suite in two parts that run side by side (scripts/test.sh): `LONGRUN_SUITE_PART=slurm` keeps the
Slurm layer's tests that need no Airflow (tests/slurm, minus those marked `airflow`), `rest` keeps every
other test. Unset: the whole suite.

Why: the Slurm layer's tests mostly wait (on Slurm's time limits, node states and requeues) and use little
CPU; run beside the rest, on a cluster of their own (each pytest session starts its own stack on its own
port range), their minutes leave the suite's critical path, as the Slurm 25.11 tier's already do. The ones
that need Airflow stay in the main part, so that only one session pays for an Airflow.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PART_ENV = "LONGRUN_SUITE_PART"
PARTS = ("slurm", "rest")
SLURM_TESTS = Path(__file__).resolve().parents[1] / "slurm"


def in_slurm_part(item: pytest.Item) -> bool:
    """A test of the Slurm layer that needs no Airflow."""
    return SLURM_TESTS in Path(item.path).resolve().parents and item.get_closest_marker("airflow") is None


def select_part(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (as `-m` would: counted, not skipped) the tests outside LONGRUN_SUITE_PART's part."""
    part = os.environ.get(PART_ENV, "")
    if not part:
        return
    if part not in PARTS:
        raise pytest.UsageError(f"{PART_ENV}={part!r}: must be one of {', '.join(PARTS)} (or unset)")
    want_slurm = part == "slurm"
    keep = [item for item in items if in_slurm_part(item) == want_slurm]
    dropped = [item for item in items if in_slurm_part(item) != want_slurm]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
