"""Identity from records, not conf (issue 28 item 7), on the real stack: real Slurm, SeaweedFS with the
orchestrator's and the job's identities, a longrun job of each run that signed its alert with the trainer's
EventWriter, and the task bodies of `training_run` and `sdc_incident` themselves (Airflow's REST path:
tests/security/test_closed_conf_airflow.py).

Each test is an attack that succeeded before: a `training_run` that said it continued a run took over the
run's name; a hand-triggered `sdc_incident` acted with the mode and spec its conf named; a genuine alert
copied to a new key opened a second incident, with a second drain slot and a second node-history mark.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from helpers.signed_job import SignedJob, submit_signed_job
from longrun import runclaim, security_events
from longrun.dagrun_ids import attempt_run_id
from longrun.health import history
from longrun.health.policy import NodePolicy
from longrun.health.ratelimit import DrainPolicy, entries
from longrun.incident import exclusive, record, step_drain, steps
from longrun.monitor import launches
from longrun.monitor.lifecycle import conf_of, spec_from_params
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.models import JobStatus
from longrun.store_access import job_store_env
from longrun.tasks import node_history, sdc_incident, training_run

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import put_json

pytestmark = [pytest.mark.slurm, pytest.mark.s3, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(slurm_cluster, s3_store_env, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The orchestrator's environment (its store keys, Slurm), its store, the job identity's store and a
    Slurm client; the jobs a test starts are cancelled at the end."""
    orch_env = {**s3_store_env, **slurm_cluster.env}
    job_env = job_store_env(orch_env)
    with pytest.MonkeyPatch.context() as mp:
        for k, val in orch_env.items():
            mp.setenv(k, val)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # boto3 takes the keys from here
            mp.setenv(k, job_env[k])
        job_store = store_from_env(job_env)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(k, orch_env[k])
        client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
        jobs: list[int] = []
        try:
            yield {
                "orch_env": orch_env,
                "orch": store_from_env(orch_env),
                "job_store": job_store,
                "client": client,
                "partition": slurm_cluster.partition,
                "workdir": tmp_path_factory.mktemp("identity"),
                "jobs": jobs,
            }
        finally:
            for job_id in jobs:
                client.cancel(job_id)


def _launched(world: dict[str, Any], mode: str) -> tuple[dict[str, Any], SignedJob]:
    """A run as `training_run` launched it: its name claimed and its launch recorded by the preflight's own
    code (for the DAG run whose tag the job carries), and its signed longrun job on n1+n2 with an alert."""
    run = f"ident-{uuid.uuid4().hex[:8]}"
    params = {"run_name": run, "nodes": 2, "gpus_per_node": 0, "incident_mode": mode}
    training_run.claim_run_name(params, f"test__{run}")  # the DAG run that submits the job below
    job = submit_signed_job(
        world["client"],
        world["orch"],
        run=run,
        orch_env=world["orch_env"],
        workdir=Path(world["workdir"]),
        partition=world["partition"],
    )
    world["jobs"].append(job.job_id)
    return params, job


def _incident_conf(job: SignedJob, **claims: Any) -> dict[str, Any]:
    """An `sdc_incident` conf as a person triggering it by hand writes it (the DAG's doc: the run, the
    alert's key and the job)."""
    return {"run_name": job.run, "alert_key": job.alert_key, "alert": None, "job_id": job.job_id, **claims}


# ---- 1. continuing a run needs the orchestrator's record of the relaunch -----------------------------


def test_a_continuation_the_orchestrator_did_not_record_is_refused(world) -> None:
    """Another user triggers `training_run` with a running run's name, its own Slurm job as
    `attach_job_id` and attempt 1 (what today's check asked: the job is named after the run and carries
    longrun's tag). Refused before anything reaches Slurm; the name stays its owner's. Only the relaunch
    the orchestrator recorded continues the run, and only as recorded."""
    params, job = _launched(world, "observe")
    run, orch = job.run, world["orch"]
    takeover = {**params, "incident_mode": "act", "attach_job_id": job.job_id, "attempt": 1}
    with pytest.raises(AirflowFailException, match="the orchestrator recorded no relaunch of attempt 1"):
        training_run.claim_run_name(takeover, "manual__someone-else")
    assert runclaim.read_claim(orch, run).dag_run_id == f"test__{run}"  # type: ignore[union-attr]
    assert [e.reason for e in security_events.events(orch, run)] == ["unrecorded_continuation"]

    # The relaunch sdc_incident recorded: its own DAG run id and conf continue the run; nothing else does.
    relaunched = spec_from_params(params).relaunch(resume_from=None, exclude=("n2",))
    result = {"params": conf_of(relaunched), "job_id": job.job_id, "incident_id": "00000007-recompute-x"}
    launches.record_relaunch(orch, result)
    conf = launches.continuation_conf(result)
    with pytest.raises(AirflowFailException, match="dag_run_id: claimed 'manual__someone-else'"):
        training_run.claim_run_name(conf, "manual__someone-else")
    with pytest.raises(AirflowFailException, match="incident_mode: claimed 'act', recorded 'observe'"):
        training_run.claim_run_name({**conf, "incident_mode": "act"}, attempt_run_id(run, 1))
    with pytest.raises(AirflowFailException, match="attach_job_id: claimed"):
        training_run.claim_run_name({**conf, "attach_job_id": job.job_id + 1000}, attempt_run_id(run, 1))
    training_run.claim_run_name(conf, attempt_run_id(run, 1))  # the genuine continuation
    assert runclaim.read_claim(orch, run).dag_run_id == f"test__{run}"  # type: ignore[union-attr]
    assert world["client"].job(job.job_id).status is JobStatus.RUNNING


# ---- 2. a hand-triggered incident reads its run, alert, mode and spec from the store -----------------


def _refused_everywhere(world: dict[str, Any], job: SignedJob, conf: dict[str, Any], says: str) -> None:
    """Every task given `conf` is refused: the job keeps running, no incident is opened, and a security
    event says the conf disagrees."""
    orch = world["orch"]
    for task in (sdc_incident.open_task, sdc_incident.freeze_task):
        with pytest.raises(AirflowFailException, match=f"refused, nothing acted on: .*{says}"):
            task(conf, "manual__by-hand")
    assert world["client"].job(job.job_id).status is JobStatus.RUNNING, "the job was cancelled"
    iid = schema.incident_id_for(job.alert_key)
    assert not orch.head(record.record_key(job.run, iid)), "an incident was opened"
    assert {e.reason for e in security_events.events(orch, job.run)} == {"conf_disagrees"}


@pytest.mark.parametrize(
    ("claim", "says"),
    [
        ("mode", "incident_mode: claimed 'act', recorded 'observe'"),
        ("spec", "nodes: claimed 1, recorded 2"),
    ],
)
def test_a_manual_incident_with_a_mode_or_spec_the_store_does_not_hold_acts_on_nothing(
    world, claim, says
) -> None:
    """The run's records say observe, two nodes. A person triggers `sdc_incident` by hand for the run's
    genuine alert with `run_params` that say act (or another spec): every task is refused, the job keeps
    running, no incident is opened, a security event says why. Before, the conf's mode was acted on (the
    freeze cancelled the job) and its spec would have been relaunched. The same trigger without
    `run_params` takes the mode and spec from the store (observe)."""
    _params, job = _launched(world, "observe")
    run_params = {"run_name": job.run, "nodes": 2, "gpus_per_node": 0, "incident_mode": "act"}
    if claim == "spec":
        run_params = {**run_params, "incident_mode": "observe", "nodes": 1}
    _refused_everywhere(world, job, _incident_conf(job, run_params=run_params), says)

    opened = sdc_incident.open_task(_incident_conf(job, alert=job.alert), "manual__by-hand")
    assert opened["mode"] == "observe"
    inc = sdc_incident.incident_from(_incident_conf(job), "manual__by-hand", world["orch"])
    launch = launches.launch_of_job(world["orch"], job.run, job.job_id)
    assert launch is not None and launch.dag_run_id == f"test__{job.run}"
    assert inc.mode == "observe" and dict(inc.run_params) == dict(launch.params)


def test_every_conf_claim_is_checked_against_the_store(world) -> None:
    """A conf naming another job, another alert or another run is refused before the alert's own check
    (`runner.authenticate` refused these already, later and as another reason), naming the field."""
    _params, job = _launched(world, "observe")
    for claims, says in (
        ({"job_id": job.job_id + 1000}, "conf job_id .* is not the job alert"),
        ({"alert": {**job.alert, "suspect_nodes": ["n1"]}}, "conf alert is not the alert in"),
        ({"run_name": f"{job.run}-b"}, "conf run_name .* is not the run of alert"),
    ):
        _refused_everywhere(world, job, _incident_conf(job, **claims), says)


# ---- 3. the same alert never counts twice ----------------------------------------------------------


def test_a_genuine_alert_copied_to_a_new_key_counts_once(world) -> None:
    """An act-mode incident handles the job's genuine alert (drain slot, node-history suspicion), then
    ends. The alert, signature and all, copied to a new key by the job identity and handed to
    `sdc_incident` joins that incident: no second incident, drain slot or mark. Triggering the original
    key again returns the same incident."""
    _params, job = _launched(world, "act")
    orch, client, hist = world["orch"], world["client"], history.history_store()
    conf = _incident_conf(job, job_id=job.job_id)
    sdc_incident.open_task(conf, "incident__first")
    inc = sdc_incident.incident_from(conf, "incident__first", orch)
    try:
        attributed = steps.attribute(orch, inc)
        node_history.after_attribute(orch, hist, inc, attributed, NodePolicy())
        drained = step_drain.drain(orch, client, inc, node="n2", policy=DrainPolicy(max_drains=10))
        node_history.after_drain(hist, inc, drained)
        assert exclusive.release(orch, run=job.run, incident_id=inc.incident_id)  # its summary ran

        copy_key = schema.store_key(job.run, schema.alert_path(7, "recompute", "r000-copy"))
        put_json(world["job_store"], copy_key, job.alert)  # what any job identity may write
        copied = {**conf, "alert_key": copy_key}
        with pytest.raises(AirflowSkipException, match=f"joins incident {inc.incident_id}"):
            sdc_incident.open_task(copied, "incident__copy")
        again = sdc_incident.open_task(conf, "manual__again")
        assert again["incident_id"] == inc.incident_id

        grants = [e for e in entries(orch) if e.get("run") == job.run]
        assert [g["incident_id"] for g in grants] == [inc.incident_id], "a second drain slot was taken"
        marks = [e for e in history.events(hist, "n2") if e.run == job.run and e.kind == history.SUSPECTED]
        assert {e.incident_id for e in marks} == {inc.incident_id}, "a second suspicion was recorded"
        assert not [e for e in history.events(hist, "n2") if e.run == job.run and e.kind == history.REPLACE]
        copy_id = schema.incident_id_for(copy_key)
        assert not orch.head(record.record_key(job.run, copy_id)), "the copy opened an incident"
        assert exclusive.joined_to(orch, run=job.run, incident_id=copy_id) == inc.incident_id
        joined = record.load(orch, run=job.run, incident_id=inc.incident_id)["joined"]
        assert [j["alert_key"] for j in joined] == [copy_key]
    finally:
        if client.node("n2").drain_flag:
            client.resume("n2")
