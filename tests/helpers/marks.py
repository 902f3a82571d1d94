"""Marks shared by the end-to-end tests: slow (out of `make test-fast`), real Slurm, S3 and Airflow, and a
timeout long enough for a drill's full story on a loaded 2-core machine."""

from __future__ import annotations

import pytest

END_TO_END = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(5400),
]
