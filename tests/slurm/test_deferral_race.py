"""Airflow 3.3.2's deferral race (apache/airflow#71580, #72716), reproduced on the real scheduler, and
longrun's answer to it: retries plus reattach, never a second Slurm job.

The race: a deferrable task defers; the LocalExecutor worker that ran it reports "success" for that
try when its supervisor returns. If that report reaches the scheduler only after the trigger fired and
the resumed try is already RUNNING (same try number), the scheduler logs "state mismatch" and fails
the running task (up_for_retry when it has retries). Upstream it shows under load, with hundreds of
sensors. Here the worker is made late on purpose, with no patch of Airflow: the test watches the
metadata database, and the moment the task instance is DEFERRED it SIGSTOPs the worker process that
supervised it (found by the process title LocalExecutor gives it), lets the trigger fire and the
resumed try start RUNNING in another worker, then SIGCONTs it. When the stop comes too late (the
worker had already reported), the run is simply a clean one; the test tries again, bounded.

Expected with longrun's operators: the run still ends as without the race (success for the sensor
DAG; the job's own verdict for the failing job), the raced task has a second try, and exactly one
Slurm job carries the task's tag.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import airflow_db
from helpers.airflow_api import AirflowApi
from longrun.hooks.slurm import SlurmHook

pytestmark = [pytest.mark.airflow, pytest.mark.slurm, pytest.mark.slow]

ATTEMPTS = 6
CASES = {
    # dag id: (deferring task, the job's tag prefix task, run state expected with or without the race)
    "example_slurm_job": ("wait", "submit", "success"),
    "example_slurm_job_fails": ("submit_and_wait", "submit_and_wait", "failed"),
}


def _one_try(api: AirflowApi, eng, dag_id: str, task_id: str) -> tuple[str, bool, str]:  # noqa: ANN001
    """Trigger a run, stall the deferring try's worker; (run id, race reproduced, what happened)."""
    run_id = api.trigger(dag_id, conf={"nodes": 1})
    row = airflow_db.wait_state(eng, dag_id, run_id, task_id, {"running"}, timeout=180, poll=0.05)
    assert row is not None, f"{task_id} never ran: {api.task_states(dag_id, run_id)}"
    worker = None
    for _ in range(200):  # the title is set right after the worker picks the workload up
        worker = airflow_db.worker_running(str(row["id"]))
        if worker:
            break
        time.sleep(0.01)
    if worker is None:
        api.wait_run(dag_id, run_id, timeout=300)
        return run_id, False, "worker not found by title"
    deferred = airflow_db.wait_state(eng, dag_id, run_id, task_id, {"deferred"}, timeout=30, poll=0.002)
    if deferred is None:  # e.g. the job had ended before the task looked: it finished without deferring
        api.wait_run(dag_id, run_id, timeout=300)
        return run_id, False, "never deferred"
    os.kill(worker, signal.SIGSTOP)
    try:
        reporting = "<idle>" not in airflow_db.title(worker)
        # The resumed try starts in another worker while this one is stopped.
        resumed = airflow_db.wait_state(
            eng, dag_id, run_id, task_id, {"running", "success", "failed"}, timeout=180, poll=0.05
        )
        what = f"stopped worker still titled with the TI: {reporting}; after resume: {resumed and resumed['state']}"
    finally:
        os.kill(worker, signal.SIGCONT)
    assert api.wait_run(dag_id, run_id, timeout=300) in ("success", "failed")
    raced = bool(airflow_db.events(eng, dag_id, run_id, task_id, "state mismatch"))
    return run_id, raced, what


@pytest.mark.parametrize("dag_id", list(CASES))
def test_a_late_worker_fails_the_resumed_try_and_the_retry_reattaches(airflow_stack, dag_id: str) -> None:
    task_id, tag_task, expected = CASES[dag_id]
    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    api.wait_dag_parsed(dag_id, file_hint="example_slurm_job")
    api.unpause(dag_id)
    eng = airflow_db.engine(airflow_stack.env["AIRFLOW_HOME"])
    hook = SlurmHook(None, slurm_conf=airflow_stack.env["SLURM_CONF"], backend="cli")
    seen = []
    try:
        for _ in range(ATTEMPTS):
            run_id, raced, what = _one_try(api, eng, dag_id, task_id)
            seen.append(f"{run_id}: raced={raced} ({what})")
            jobs = hook.find_jobs(f"longrun/{dag_id}/{run_id}/{tag_task}/")
            # With or without the race: one job, whatever the tries.
            assert len(jobs) == 1, (seen, jobs)
            assert api.run_state(dag_id, run_id) == expected, (seen, api.task_states(dag_id, run_id))
            if raced:
                ti = airflow_db.ti_row(eng, dag_id, run_id, task_id)
                assert ti is not None and ti["try_number"] >= 2, (seen, ti)
                print("\n".join(seen))
                return
    finally:
        eng.dispose()
    pytest.skip(f"the race was not reproduced in {ATTEMPTS} runs (each stayed clean): {seen}")
