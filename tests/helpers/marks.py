"""Marks shared by the end-to-end tests: slow (out of `make test-fast`), real Slurm, S3 and Airflow, and a
timeout long enough for a drill's full story on a loaded 2-core machine."""

from __future__ import annotations

import os

import pytest

END_TO_END = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(5400),
]

#: `make test-drills` sets it: the drills `make test` leaves out (CI's time budget keeps one of each path).
ALL_DRILLS_ENV = "LONGRUN_ALL_DRILLS"


def only_in_test_drills(why: str) -> None:
    """Skip the calling test unless `make test-drills` runs it, saying why `make test` leaves it out."""
    if os.environ.get(ALL_DRILLS_ENV) != "1":
        pytest.skip(f"runs with `make test-drills` ({ALL_DRILLS_ENV}=1): {why}")
