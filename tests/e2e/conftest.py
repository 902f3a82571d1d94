"""An end-to-end test that fails ends what it started: its DAG runs, jobs, drains and reservations. The
drill modules' `env` and `rest` fixtures come from helpers.drill_fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers.cleanup import fail_active_runs, restore_cluster
from helpers.drill_fixtures import env, rest
from longrun.airflow_rest import AirflowRest
from longrun.slurm.factory import make_client

__all__ = ["env", "rest"]

FAILED = pytest.StashKey[set]()
"""The phases (setup, call, teardown) of a test that failed."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed:
        item.stash.setdefault(FAILED, set()).add(report.when)
    return report


@pytest.fixture(autouse=True)
def restore_on_failure(request: pytest.FixtureRequest, airflow_stack) -> Iterator[None]:  # noqa: ANN001
    yield
    if not request.node.stash.get(FAILED, set()):
        return
    env = airflow_stack.env
    try:
        rest = AirflowRest.login(
            env["LONGRUN_AIRFLOW_URL"], env["LONGRUN_AIRFLOW_USER"], env["LONGRUN_AIRFLOW_PASSWORD"]
        )
        fail_active_runs(rest)
    finally:
        restore_cluster(
            make_client(backend="cli", slurm_conf=env.get("SLURM_CONF") or os.environ["SLURM_CONF"])
        )
