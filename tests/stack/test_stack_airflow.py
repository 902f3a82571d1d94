"""The session's Airflow: healthy, logs in, listens on 127.0.0.1 only, and runs a DAG through its
real scheduler and executor, triggered over REST."""

from __future__ import annotations

import pytest
import requests
from helpers.airflow_api import AirflowApi
from helpers.stack_fixtures import AirflowStack
from longrun.airflow_rest import AirflowRest
from longrun.stack.airflow import DAEMONS, torch_mapped
from longrun.stack.stack import Stack

from .listening import listeners, process_group_pids

pytestmark = pytest.mark.airflow


def test_healthy_and_login(airflow_stack: AirflowStack) -> None:
    health = requests.get(f"{airflow_stack.url}/api/v2/monitor/health", timeout=5).json()
    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
        assert health[part]["status"] == "healthy", health
    bad = requests.post(
        f"{airflow_stack.url}/auth/token",
        json={"username": airflow_stack.user, "password": "wrong"},
        timeout=5,
    )
    assert bad.status_code == 401
    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    assert "dags" in api.get("/dags", limit=1)


def test_listens_on_loopback_only(airflow_stack: AirflowStack, local_stack: Stack) -> None:
    pgids = {st.pid for st in local_stack.airflow.status()}
    ours = process_group_pids(pgids)
    mine = [s for s in listeners() if set(s.pids) & ours]
    assert [(s.address, s.port) for s in mine] == [("127.0.0.1", local_stack.layout.airflow_port)]


def test_smoke_dag_through_scheduler(airflow_stack: AirflowStack, local_stack: Stack) -> None:
    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    api.wait_dag_parsed("smoke", timeout=90, file_hint="smoke.py")
    api.unpause("smoke")
    run_id = api.trigger("smoke", conf={})
    assert api.wait_run("smoke", run_id, timeout=120) == "success", api.task_states("smoke", run_id)
    assert api.task_states("smoke", run_id) == {"hello": "success"}
    log = api.task_log("smoke", run_id, "hello")
    # The stack hands Slurm and S3 settings to tasks.
    assert "stack variables present: SLURM_CONF AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID LONGRUN_BUCKET" in log, log
    # The task is a fork of the scheduler's worker: with preload_torch (a test session's stack) it finds
    # torch imported already; without, it does not (nothing before the task imports it).
    preloaded = "yes" if local_stack.layout.preload_torch else "no"
    assert f"torch imported before the task: {preloaded}" in log, log


def test_clear_tasks_runs_a_finished_task_again(airflow_stack: AirflowStack) -> None:
    """AirflowRest.clear_tasks (what an operator's Clear does; the chaos matrix's operator uses it) puts
    a finished run back to running and its task runs a second try."""
    rest = AirflowRest.login(airflow_stack.url, airflow_stack.user, airflow_stack.password, timeout=120.0)
    rest.wait_dag_parsed("smoke", timeout=90)
    rest.unpause("smoke")
    run_id = rest.trigger("smoke", {})
    assert rest.wait_run("smoke", run_id, timeout=120) == "success"
    assert rest.clear_tasks("smoke", run_id, ["hello"]) == ["hello"]
    assert rest.wait_run("smoke", run_id, timeout=120) == "success"
    (ti,) = rest.task_instances("smoke", run_id)
    assert (ti["task_id"], ti["state"], ti["try_number"]) == ("hello", "success", 2), ti


def test_only_the_scheduler_preloads_torch(airflow_stack: AirflowStack, local_stack: Stack) -> None:
    """preload_torch imports torch in the scheduler only (its workers and tasks are forks of it); the
    api-server, dag-processor and triggerer would only pay its memory and start-up time."""
    daemons = dict(DAEMONS)
    loaded = {st.name: torch_mapped(st.pid) for st in local_stack.airflow.status() if st.name in daemons}
    preloaded = local_stack.layout.preload_torch
    assert loaded == {"api-server": False, "scheduler": preloaded, "dag-processor": False, "triggerer": False}
