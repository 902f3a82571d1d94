"""Put the session's cluster and Airflow back after a test that failed half-way.

A failed end-to-end test leaves a training job running, an incident DAG run waiting, a node drained by
longrun or a MAINT reservation behind; the next test would then start on a cluster that is not clean
and fail for a reason of the first one. This ends exactly what longrun started: DAG runs of longrun's
DAGs that are still active, Slurm jobs carrying longrun's tag, nodes whose drain reason carries
longrun's prefix, reservations named by longrun.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from longrun.airflow_rest import AirflowApiError, AirflowRest
from longrun.slurm.client import SlurmClient

from training.records import schema

LONGRUN_DAGS = ("training_run", "sdc_incident", "node_return")
ACTIVE_RUN_STATES = ("queued", "running")
JOB_TAG_PREFIX = "longrun/"
RESERVATION_PREFIX = "longrun_"
CANCEL_WAIT_S = 60.0


def fail_active_runs(rest: AirflowRest, say: Callable[[str], None] = print) -> list[tuple[str, str]]:
    """Mark every queued or running run of longrun's DAGs failed (Airflow then ends their tasks)."""
    ended = []
    for dag_id in LONGRUN_DAGS:
        try:
            runs = rest.get(f"/dags/{dag_id}/dagRuns", limit=100, order_by="-start_date")["dag_runs"]
        except AirflowApiError:
            continue  # a DAG this checkout does not have
        for run in runs:
            if run["state"] in ACTIVE_RUN_STATES:
                rest.call("PATCH", f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}", json={"state": "failed"})
                ended.append((dag_id, run["dag_run_id"]))
                say(f"cleanup: marked {dag_id} {run['dag_run_id']} failed")
    return ended


def restore_cluster(client: SlurmClient, say: Callable[[str], None] = print) -> None:
    """Cancel longrun's jobs, delete its reservations, resume the nodes it drained."""
    cancelled = []
    for job in client.jobs():
        if job.is_active and (job.comment or "").startswith(JOB_TAG_PREFIX):
            client.cancel(job.job_id)
            cancelled.append(job.job_id)
            say(f"cleanup: cancelled job {job.job_id} ({job.comment})")
    # A cancelled job is COMPLETING for a moment and holds its nodes: wait (bounded) until it ends.
    deadline = time.monotonic() + CANCEL_WAIT_S
    while cancelled and time.monotonic() < deadline:
        cancelled = [j for j in cancelled if client.job(j).is_active]
        time.sleep(0.3)
    if cancelled:
        say(f"cleanup: jobs {cancelled} still active {CANCEL_WAIT_S:.0f} s after scancel")
    for name in client.reservations():
        if name.startswith(RESERVATION_PREFIX):
            client.delete_reservation(name)
            say(f"cleanup: deleted reservation {name}")
    for node in client.nodes():
        if node.drain_flag and (node.reason or "").startswith(schema.DRAIN_PREFIX):
            client.resume(node.name)
            say(f"cleanup: resumed {node.name} (was: {node.reason})")
