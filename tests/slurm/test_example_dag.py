"""example_slurm_job DAGs through a real Airflow scheduler and triggerer (not dag.test()): the sensor
defers in the triggerer, which must import SlurmJobTrigger from the installed package."""

from __future__ import annotations

import pytest
from helpers.airflow_api import AirflowApi
from longrun.hooks.slurm import SlurmHook

pytestmark = [pytest.mark.airflow, pytest.mark.slurm]

FILE = "example_slurm_job"


def explain(api: AirflowApi, dag_id: str, run_id: str) -> str:
    """Task states and the tail of each task's log, for a failure message."""
    out = [str(api.task_states(dag_id, run_id))]
    for task_id in api.task_states(dag_id, run_id):
        log = api.task_log(dag_id, run_id, task_id)
        at = log.find("error_detail")
        out.append(f"--- {task_id}\n" + (log[at : at + 4000] if at >= 0 else log[-3000:]))
    return "\n".join(out)


@pytest.fixture(scope="module")
def api(airflow_stack) -> AirflowApi:
    return AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)


def test_job_succeeds_through_the_deferrable_sensor(api, airflow_stack):
    api.wait_dag_parsed("example_slurm_job", file_hint=FILE)
    api.unpause("example_slurm_job")
    run_id = api.trigger("example_slurm_job", conf={"nodes": 2})
    state = api.wait_run("example_slurm_job", run_id, timeout=240)
    assert state == "success", explain(api, "example_slurm_job", run_id)
    tis = {ti["task_id"]: ti for ti in api.task_instances("example_slurm_job", run_id)}
    assert {k: ti["state"] for k, ti in tis.items()} == {"submit": "success", "wait": "success"}
    # The last try's log (an earlier try may have lost apache/airflow#71580's race and been retried).
    log = api.task_log("example_slurm_job", run_id, "wait", try_number=tis["wait"]["try_number"])
    assert "COMPLETED" in log, log[-2000:]
    hook = SlurmHook(None, slurm_conf=airflow_stack.env["SLURM_CONF"], backend="cli")
    (job,) = hook.find_jobs(
        f"longrun/example_slurm_job/{run_id}/submit/"
    )  # submitted once, whatever the tries
    assert job.status.value == "completed" and len(job.nodes) == 2


def test_failing_job_fails_the_task_with_the_slurm_reason(api, airflow_stack):
    api.wait_dag_parsed("example_slurm_job_fails", file_hint=FILE)
    api.unpause("example_slurm_job_fails")
    run_id = api.trigger("example_slurm_job_fails")
    state = api.wait_run("example_slurm_job_fails", run_id, timeout=240)
    assert state == "failed", explain(api, "example_slurm_job_fails", run_id)
    (ti,) = api.task_instances("example_slurm_job_fails", run_id)
    assert ti["state"] == "failed"
    log = api.task_log("example_slurm_job_fails", run_id, "submit_and_wait", try_number=ti["try_number"])
    assert "NonZeroExitCode" in log and "exit_code=3" in log, log[-2000:]
    # Terminal: even if Airflow retried the task (see the DAG's docstring), no second job was submitted.
    hook = SlurmHook(None, slurm_conf=airflow_stack.env["SLURM_CONF"], backend="cli")
    assert len(hook.find_jobs(f"longrun/example_slurm_job_fails/{run_id}/submit_and_wait/")) == 1
