"""Closed conf and hand-triggered incidents through a real Airflow 3.3 (REST), real Slurm and SeaweedFS.

Airflow 3.3 validates the values of declared Params at the REST call but merges undeclared conf keys
into `params` without a word, so the refusal lives in the first task (preflight / open_record), before
anything reaches Slurm. Before this change a `training_run` conf with `extra_env` reached RunSpec and
every rank's environment, and `sdc_incident` triggered by hand with another job's id cancelled that job;
a `training_run` whose conf said it continued someone else's run took the run's name (issue 28 item 7).
"""

from __future__ import annotations

import time
import uuid

import pytest
from helpers.airflow_api import AirflowApi
from longrun import runclaim, security_events
from longrun.incident import origin
from longrun.monitor import launches
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag

from training.records import schema
from training.store.factory import store_from_env

pytestmark = [pytest.mark.airflow, pytest.mark.slurm, pytest.mark.s3, pytest.mark.slow]


@pytest.fixture(scope="module")
def api(airflow_stack):
    with pytest.MonkeyPatch.context() as mp:
        for k, val in airflow_stack.env.items():
            mp.setenv(k, val)
        a = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
        for dag_id in ("training_run", "sdc_incident"):
            a.dag_ready(dag_id)
        yield a


def _our_jobs(client: CliSlurmClient, name: str) -> list[int]:
    return [j.job_id for j in client.jobs() if j.name == name]


@pytest.mark.parametrize(
    ("key", "value"),
    [("extra_env", {"LD_PRELOAD": "/tmp/evil.so"}), ("max_restarts", 100), ("seed", 7)],
)
def test_an_undeclared_conf_key_is_refused_before_slurm(api, slurm_cluster, key, value) -> None:
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    run = f"conf-{uuid.uuid4().hex[:6]}"
    conf = {"run_name": run, "nodes": 1, "gpus_per_node": 0, "steps": 2, "checkpoint_every": 1, key: value}
    run_id = api.trigger("training_run", conf=conf)
    try:
        assert api.wait_run("training_run", run_id, timeout=180) == "failed"
        states = api.task_states("training_run", run_id)
        assert states["preflight"] == "failed" and states.get("submit") != "success", states
        assert f"conf key {key!r} is not a parameter" in api.task_log("training_run", run_id, "preflight")
        assert _our_jobs(client, run) == [], "a job reached Slurm"
    finally:
        for job_id in _our_jobs(client, run):
            client.cancel(job_id)


def test_sdc_incident_by_hand_with_another_jobs_id_cancels_nothing(api, slurm_cluster, tmp_path) -> None:
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    other = client.submit(
        JobSpec(
            name="someone-elses-job",
            partition=slurm_cluster.partition,
            comment="user/analysis",
            nodes=1,
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=10,
            workdir=str(tmp_path),
            command=("sleep 600",),
        )
    )
    run = f"hand-{uuid.uuid4().hex[:6]}"
    alert = schema.record(
        "alert",
        run=run,
        step=5,
        check="finite",
        suspect_ranks=[0],
        suspect_nodes=["n1"],
        evidence={"world": {"world_size": 3}},
    )
    key = schema.store_key(run, schema.alert_path(5, "finite", "hand"))
    try:
        deadline = time.monotonic() + 60
        while client.job(other).status is not JobStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.5)
        run_id = api.trigger(
            "sdc_incident",
            conf={
                "run_name": run,
                "alert_key": key,
                "alert": alert,
                "job_id": other,
                "run_params": {"run_name": run, "nodes": 3, "gpus_per_node": 0, "incident_mode": "act"},
            },
        )
        assert api.wait_run("sdc_incident", run_id, timeout=240) == "failed"
        states = api.task_states("sdc_incident", run_id)
        assert states["open_record"] == "failed" and states.get("freeze") != "success", states
        assert client.job(other).status is JobStatus.RUNNING, "the other job was cancelled"
        assert not client.node("n1").drain_flag
        events = security_events.events(store_from_env(), run)
        # The alert named by conf is not in the store: the incident reads the alert, the run, the job and the
        # spec from the store (longrun.incident.origin), so it stops there, before any job or node is looked
        # at. The job-id check behind it, with a genuine signed alert, is tests/security/test_signed_alerts.py's
        # test of the same name (real Slurm, the incident's own steps).
        # (each task that reads the origin records it: one reason, possibly more than one event)
        assert events and {e.reason for e in events} == {origin.ALERT_NOT_FOUND}, events
    finally:
        client.cancel(other)


def test_another_user_cannot_continue_a_run_by_conf(api, slurm_cluster, tmp_path) -> None:
    """Issue 28 item 7: a `training_run` triggered with a claimed run's name, `attach_job_id` of that run's
    own job (named after the run, with longrun's tag: all the check before asked) and attempt 1 is refused
    in preflight, because the orchestrator recorded no such relaunch; the name stays its owner's and the
    run's job is not watched by the intruder's run."""
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    store = store_from_env()
    run, owner = f"take-{uuid.uuid4().hex[:6]}", "manual__the-owner"
    params = {"run_name": run, "nodes": 1, "gpus_per_node": 0, "incident_mode": "observe"}
    runclaim.claim(store, run, owner, continues=False)  # what the owner's preflight did
    launches.record_first(store, params, owner)
    job = client.submit(
        JobSpec(
            name=run,
            partition=slurm_cluster.partition,
            comment=JobTag(dag_id="training_run", run_id=owner, task_id="submit").render(),
            nodes=1,
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=10,
            workdir=str(tmp_path),
            command=("sleep 600",),
        )
    )
    try:
        conf = {**params, "incident_mode": "act", "attach_job_id": job, "attempt": 1}
        run_id = api.trigger("training_run", conf=conf)
        assert api.wait_run("training_run", run_id, timeout=240) == "failed"
        states = api.task_states("training_run", run_id)
        assert states["preflight"] == "failed" and states.get("monitor") != "success", states
        assert "recorded no relaunch of attempt 1" in api.task_log("training_run", run_id, "preflight")
        assert runclaim.read_claim(store, run).dag_run_id == owner  # type: ignore[union-attr]
        assert [e.reason for e in security_events.events(store, run)] == ["unrecorded_continuation"]
        assert client.job(job).status in (JobStatus.RUNNING, JobStatus.PENDING)
    finally:
        client.cancel(job)
