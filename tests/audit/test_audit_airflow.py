"""DAG `checkpoint_audit` on demand through a real scheduler (REST trigger), over the stack's S3 bucket.

The bucket is shared with the rest of the session, so the on-demand audit names the one healthy run this
test wrote (Param `runs`): it must succeed, whatever other tests left in the bucket. Then the report is in the
bucket under `audit/<run id>/`, covers that run only, and the task log prints the Data Docs link. How a
failing audit reports (runbook link, findings) is tested without Airflow in tests/audit/test_audit.py."""

from __future__ import annotations

import uuid

import pytest
from helpers.airflow_api import AirflowApi
from longrun.audit.config import audit_id_from

from training.store.factory import store_from_env
from training.store.interface import get_json

from .builders import healthy_run

pytestmark = [pytest.mark.airflow, pytest.mark.s3, pytest.mark.slurm, pytest.mark.slow]

DAG = "checkpoint_audit"


def test_audit_runs_on_demand_and_publishes(airflow_stack, monkeypatch: pytest.MonkeyPatch) -> None:
    env = airflow_stack.env
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, env[name])
    store = store_from_env(env)
    run = f"audit-{uuid.uuid4().hex[:8]}"
    healthy_run(store, run)

    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    api.wait_dag_parsed(DAG, file_hint=DAG)
    assert api.dag(DAG)["is_paused"] is False  # created unpaused: the daily audit runs without anyone's help
    run_id = api.trigger(DAG, conf={"sample_size": 8, "seed": 1, "runs": [run]})
    state = api.wait_run(DAG, run_id, timeout=420, interval=2.0)
    log = api.task_log(DAG, run_id, "audit")
    audit_id = audit_id_from(run_id)
    summary = get_json(store, f"audit/{audit_id}/summary.json")
    assert state == "success", log[-3000:]
    assert summary["success"] is True, summary
    assert summary["runs"] == [run], summary
    assert store.head(f"audit/{audit_id}/docs/index.html") is not None
    assert f"audit/{audit_id}/docs/index.html" in log, log[-3000:]
    assert summary["counts"].get("manifest", 0) >= 3
