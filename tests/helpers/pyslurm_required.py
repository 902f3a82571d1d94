"""A pyslurm test skips where pyslurm is missing, and fails where the tier requires it."""

from __future__ import annotations

import os

import pytest


def skip_without_pyslurm(reason: str) -> None:
    """Skip a test pyslurm is missing for, with `reason`; a failure where pyslurm is required.

    The Slurm 25.11 tier (scripts/test-slurm-25.11.sh) sets LONGRUN_REQUIRE_PYSLURM=1: there pyslurm is
    built, so a pyslurm test that would skip is a broken tier, not a test that may pass silently.
    """
    if os.environ.get("LONGRUN_REQUIRE_PYSLURM") == "1":
        pytest.fail(f"pyslurm required here (LONGRUN_REQUIRE_PYSLURM=1) but unusable: {reason}")
    pytest.skip(reason)
