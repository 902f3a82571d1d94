"""The suite in parts that run side by side (scripts/test.sh), chosen by `LONGRUN_SUITE_PART`:

- `slurm`: the tests that need no Airflow in tests/slurm (the Slurm layer) and tests/nvrx (jobs under
  NVRx's launcher on the cluster);
- `airflow`: every other test that needs the session's Airflow (the `airflow_stack` fixture, or the
  `airflow` mark): the end-to-end drills, the UI in a browser, the DAGs run through the REST API;
- `other`: everything else (units, the job side on gloo ranks, Slurm and S3 without Airflow);
- `rest`: `airflow` and `other` together (one session); unset: the whole suite.

Why: on two cores one pytest session keeps one core busy while it runs CPU-bound tests, and waits on
Airflow, Slurm and the trainers for much of the rest. Each part is its own pytest session with a stack of
its own (its own state dir and port range), so their waits and their CPU interleave. Only the `airflow`
part starts an Airflow, so the suite pays for one. tests/nvrx is in `slurm` to balance the parts: in a
clean-clone run at b8096fe `other` ran alone for its last 13 minutes (3,265 s against the `airflow`
part's 2,481 and `slurm`'s 274), and tests/nvrx is about 450 s of its time on a quiet machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PART_ENV = "LONGRUN_SUITE_PART"
PARTS = ("slurm", "airflow", "other", "rest")
TESTS = Path(__file__).resolve().parents[1]
SLURM_PART_DIRS = (TESTS / "slurm", TESTS / "nvrx")


def needs_airflow(item: pytest.Item) -> bool:
    """The test uses the session's Airflow: through its fixtures, or by its mark."""
    return (
        "airflow_stack" in getattr(item, "fixturenames", ()) or item.get_closest_marker("airflow") is not None
    )


def part_of(item: pytest.Item) -> str:
    """The one part (`slurm`, `airflow` or `other`) that runs `item`."""
    if needs_airflow(item):
        return "airflow"
    if any(d in Path(item.path).resolve().parents for d in SLURM_PART_DIRS):
        return "slurm"
    return "other"


def in_part(item: pytest.Item, part: str) -> bool:
    return part_of(item) in (("airflow", "other") if part == "rest" else (part,))


def select_part(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (as `-m` would: counted, not skipped) the tests outside LONGRUN_SUITE_PART's part."""
    part = os.environ.get(PART_ENV, "")
    if not part:
        return
    if part not in PARTS:
        raise pytest.UsageError(f"{PART_ENV}={part!r}: must be one of {', '.join(PARTS)} (or unset)")
    keep = [item for item in items if in_part(item, part)]
    dropped = [item for item in items if not in_part(item, part)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
