"""Signed alerts and acting only on what is ours (issue 10, items 2-4) on the real stack: real Slurm,
SeaweedFS with the orchestrator's and the job's identities, the trainer's own EventWriter signing inside
a Slurm job that got its key through `--export`.

Each attack writes its record with the JOB identity's keys (what a job, or anyone holding its store
credentials, can do) and then runs the incident's own steps against the real cluster. Before the
change, the unsigned/forged/foreign alerts below cancelled the job and drained the node they named, and
the job's environment held everything the Airflow worker had.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from helpers.signed_job import SignedJob, submit_signed_job
from longrun import alert_auth, security_events
from longrun.health.ratelimit import DrainPolicy, entries
from longrun.incident import runner, step_drain, step_relaunch, steps
from longrun.run_identity import SeaweedRunIdentities, identities_from_env
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec
from longrun.store_access import job_store_env

from training.records import schema, signing
from training.store.factory import store_from_env
from training.store.interface import put_json

pytestmark = [pytest.mark.slurm, pytest.mark.s3, pytest.mark.slow]

# Planted in the submitting (Airflow worker's) environment: none of it may reach the job.
PLANTED = {
    "AIRFLOW__CORE__FERNET_KEY": "planted-fernet-key",
    "AIRFLOW__API_AUTH__JWT_SECRET": "planted-jwt-secret",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://planted:planted@db/airflow",
    "LONGRUN_AIRFLOW_PASSWORD": "planted-airflow-password",
    "SOME_UNLISTED_VARIABLE": "planted-unlisted",
}


@pytest.fixture(scope="module")
def world(slurm_cluster, s3_store_env, tmp_path_factory) -> Iterator[dict]:
    """The orchestrator's store and Slurm client (in an environment holding Airflow's secrets), and one
    signed longrun job of a fresh run on n1+n2. Everything it changed is undone at the end."""
    orch_env = {**s3_store_env, **slurm_cluster.env}
    job_env = job_store_env(orch_env)
    with pytest.MonkeyPatch.context() as mp:
        for k, val in {**orch_env, **PLANTED}.items():
            mp.setenv(k, val)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(k, job_env[k])
        job_store = store_from_env(job_env)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(k, orch_env[k])
        orch = store_from_env(orch_env)
        client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
        workdir = tmp_path_factory.mktemp("signed")
        run = f"sig-{uuid.uuid4().hex[:8]}"
        extra_jobs: list[int] = []
        job = submit_signed_job(
            client, orch, run=run, orch_env=orch_env, workdir=workdir, partition=slurm_cluster.partition
        )
        try:
            yield {
                "orch": orch,
                "job_store": job_store,
                "client": client,
                "job": job,
                "run": run,
                "workdir": workdir,
                "extra_jobs": extra_jobs,
                "partition": slurm_cluster.partition,
                "job_secret": job_env["AWS_SECRET_ACCESS_KEY"],
                "orch_env": orch_env,
            }
        finally:
            for job_id in [job.job_id, *extra_jobs]:
                client.cancel(job_id)
            identities_from_env(orch_env).revoke(run)  # the run's store identity (longrun.run_identity)
            for n in client.nodes():
                if n.drain_flag and n.is_ours:
                    client.resume(n.name)


def _incident(w: dict, alert: dict, key: str, *, job_id: int | None = None, run: str | None = None):
    run = run or w["run"]
    return runner.Incident(
        run=run,
        alert_key=key,
        alert=alert,
        job_id=w["job"].job_id if job_id is None else job_id,
        run_params={"run_name": run, "nodes": 2, "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id=f"incident__{uuid.uuid4().hex[:6]}",
    )


def _forge(w: dict, alert: dict, name: str) -> str:
    """Write `alert` under the run's alerts/ with the job identity's keys; return its store key."""
    key = schema.store_key(w["run"], schema.alert_path(int(alert["step"]), str(alert["check"]), name))
    put_json(w["job_store"], key, alert)
    return key


def _assert_nothing_acted(w: dict, inc: runner.Incident, reason: str, node: str) -> None:
    client = w["client"]
    before = len(entries(w["orch"]))
    steps.open_record(w["orch"], inc)  # bypass the open task's gate: each destructive step gates itself
    with pytest.raises(runner.IncidentStop, match=reason):
        steps.freeze(w["orch"], client, inc, grace_s=0.1)
    with pytest.raises(runner.IncidentStop, match=reason):
        step_drain.drain(w["orch"], client, inc, node=node, policy=DrainPolicy(max_drains=10))
    with pytest.raises(runner.IncidentStop, match=reason):
        step_relaunch.relaunch(w["orch"], client, inc, node=node, checkpoint={}, make_job=_never)
    assert client.job(w["job"].job_id).status is JobStatus.RUNNING, "the job was cancelled"
    assert not client.node(node).drain_flag, f"{node} was drained"
    assert len(entries(w["orch"])) == before, "a drain-ledger slot was used"
    events = [
        e for e in security_events.events(w["orch"], inc.run) if e.details.get("alert_key") == inc.alert_key
    ]
    assert events and {e.reason for e in events} == {reason}


def _never(*_a, **_k) -> JobSpec:
    raise AssertionError("a relaunch was built for an alert that did not check out")


def test_the_job_gets_its_key_out_of_band_and_nothing_of_airflow(world) -> None:
    job: SignedJob = world["job"]
    env = dict(line.split("=", 1) for line in job.env_file.read_text().splitlines() if "=" in line)
    for name, value in PLANTED.items():
        assert name not in env and value not in job.env_file.read_text(), f"{name} reached the job"
    assert not [k for k in env if k.startswith("AIRFLOW")]
    assert signing.KEY_ENV in env and env["PATH"]
    # What the script exports reaches a step too (sbatch's --export list would otherwise bind srun).
    assert env.get("AWS_ENDPOINT_URL") and env.get("LONGRUN_BUCKET")
    # The job holds its run's own store identity: neither the orchestrator's keys nor the shared job's.
    assert env.get("AWS_ACCESS_KEY_ID") in SeaweedRunIdentities(world["orch_env"]).key_ids(job.run)
    assert env.get("AWS_SECRET_ACCESS_KEY") not in (
        world["job_secret"],
        world["orch_env"]["AWS_SECRET_ACCESS_KEY"],
    )
    # The key is in neither the batch script Slurm keeps nor the job's record of it.
    script = subprocess.run(
        ["scontrol", "write", "batch_script", str(job.job_id), "-"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    show = subprocess.run(
        ["scontrol", "show", "job", "-d", str(job.job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert env[signing.KEY_ENV] not in script and env[signing.KEY_ENV] not in show
    assert env["AWS_SECRET_ACCESS_KEY"] not in script
    assert "planted" not in script
    # ... nor in the alert record it signed.
    assert env[signing.KEY_ENV] not in json.dumps(job.alert)


def test_a_signed_alert_of_the_job_checks_out(world) -> None:
    job: SignedJob = world["job"]
    assert job.alert["job_id"] == job.job_id and job.alert["signature"].startswith(signing.SCHEME)
    v = alert_auth.verify_alert(
        world["orch"], world["client"], run=world["run"], job_id=job.job_id, alert=job.alert
    )
    assert v.ok, v
    assert set(v.allocation) == {"n1", "n2"}


@pytest.mark.parametrize(
    ("case", "reason", "node"),
    [
        ("unsigned", "unsigned", "n2"),
        ("wrong key", "bad_signature", "n2"),
        ("altered suspect", "bad_signature", "n3"),
        ("node outside the allocation", "node_outside_allocation", "n4"),
    ],
)
def test_a_forged_alert_drains_nothing_cancels_nothing(world, case: str, reason: str, node: str) -> None:
    job: SignedJob = world["job"]
    genuine = {k: v for k, v in job.alert.items() if k != signing.SIGNATURE_FIELD}
    forged = {**genuine, "suspect_nodes": [node], "time": genuine["time"] + 1}
    if case == "wrong key":
        forged = signing.sign(forged, signing.new_key())
    elif case == "altered suspect":
        forged = {**forged, signing.SIGNATURE_FIELD: job.alert[signing.SIGNATURE_FIELD]}
    elif case == "node outside the allocation":
        # A job that holds its own key and lies about a node it does not have.
        state = world["client"].job(job.job_id)
        forged = signing.sign(forged, alert_auth.job_key(world["orch"], state, world["run"]))
    key = _forge(world, forged, f"forged-{uuid.uuid4().hex[:6]}")
    _assert_nothing_acted(world, _incident(world, forged, key), reason, node)


def test_sdc_incident_by_hand_with_another_jobs_id_cancels_nothing(world) -> None:
    client: CliSlurmClient = world["client"]
    other = client.submit(
        JobSpec(
            name="someone-elses-job",
            partition=world["partition"],
            comment="user/analysis",
            nodes=1,
            nodelist=("n3",),
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=10,
            workdir=str(world["workdir"]),
            command=("sleep 600",),
        )
    )
    world["extra_jobs"].append(other)
    job: SignedJob = world["job"]
    inc = _incident(world, job.alert, job.alert_key, job_id=other)
    steps.open_record(world["orch"], inc)
    with pytest.raises(runner.IncidentStop, match="not_our_job"):
        steps.freeze(world["orch"], client, inc, grace_s=0.1)
    state = client.job(other)
    assert state.status in (JobStatus.RUNNING, JobStatus.PENDING), (
        f"the other job was touched: {state.describe()}"
    )
    # A genuine alert replayed against this run's name but another run: refused too.
    other_run = _incident(world, job.alert, job.alert_key, run=f"{world['run']}-b")
    with pytest.raises(runner.IncidentStop, match="not_our_job"):
        runner.authenticate(world["orch"], client, other_run)
    assert client.job(job.job_id).status is JobStatus.RUNNING


@pytest.mark.parametrize("bad", ["ALL", "all", "n[1-3]", "n1,n2", "n1 n2", "-n1"])
def test_the_node_validator_refuses_keywords_and_node_sets(world, bad: str) -> None:
    client: CliSlurmClient = world["client"]
    with pytest.raises(InvalidSpecError):
        client.drain(bad, "longrun:sdc:attack:1")
    assert not [n.name for n in client.nodes() if n.drain_flag], "a node was drained"


def test_a_relaunch_the_drain_did_not_precede_is_skipped_and_touches_nothing(world) -> None:
    """In approve mode a rejected drain skips only `drain`; `relaunch` (none_failed_min_one_success) still
    runs, with no checkpoint picked. The step itself refuses: skipped, nothing ended or submitted."""
    job: SignedJob = world["job"]
    inc = _incident(world, job.alert, job.alert_key)
    steps.open_record(world["orch"], inc)
    with pytest.raises(runner.IncidentSkip, match="n2 was not drained"):
        step_relaunch.relaunch(world["orch"], world["client"], inc, node="n2", checkpoint={}, make_job=_never)
    assert world["client"].job(job.job_id).status is JobStatus.RUNNING, "the job was ended"
    assert not world["client"].node("n2").drain_flag
    assert "relaunch_submitted" not in [e.event for e in inc.rec(world["orch"]).timeline]


class _NodesLost:
    """The real client, except that Slurm no longer lists the alerting job's nodes: as after a slurmctld
    killed before it saved the job's end (fault matrix, freeze x slurmctld on PostgreSQL), which recovers
    the job as running, requeues it for node failure and then reports no nodes. Only that view is
    simulated: no test can time slurmctld's unsaved state."""

    def __init__(self, client: CliSlurmClient, job_id: int) -> None:
        self._client, self._job_id = client, job_id

    def __getattr__(self, name: str):  # noqa: ANN204 - everything else is the real client
        return getattr(self._client, name)

    def job(self, job_id: int):  # noqa: ANN201
        state = self._client.job(job_id)
        if job_id != self._job_id:
            return state
        return dataclasses.replace(state, nodes=(), status=JobStatus.REQUEUED, slurm_state="PENDING")


def test_the_allocation_seen_when_the_incident_opened_still_counts_once_slurm_lost_it(world) -> None:
    """Without it, a genuine alert was refused as `node_outside_allocation` (a false security event) and
    the run never relaunched. The recorded nodes widen only the allocation check: the signature, the
    run and the job are checked each time, and a node outside both is still refused."""
    job: SignedJob = world["job"]
    orch, client = world["orch"], world["client"]
    inc = _incident(world, job.alert, job.alert_key)
    verdict = runner.authenticate(orch, client, inc, node="n2")  # as the open task does
    steps.open_record(orch, inc, allocation=verdict.allocation)
    assert set(verdict.allocation) == {"n1", "n2"}
    lost = _NodesLost(client, job.job_id)
    before = alert_auth.verify_alert(orch, lost, run=inc.run, job_id=job.job_id, alert=job.alert)
    assert (before.ok, before.reason) == (False, "node_outside_allocation"), before
    assert runner.authenticate(orch, lost, inc, node="n2").ok  # the recorded nodes count
    known = ("n1", "n2")
    outside = {**job.alert, "suspect_nodes": ["n3"]}
    outside = signing.sign(outside, alert_auth.job_key(orch, client.job(job.job_id), inc.run))
    refused = alert_auth.verify_alert(
        orch, lost, run=inc.run, job_id=job.job_id, alert=outside, known_allocation=known
    )
    assert (refused.ok, refused.reason) == (False, "node_outside_allocation"), refused
    forged = signing.sign({**job.alert, "time": job.alert["time"] + 1}, signing.new_key())
    refused = alert_auth.verify_alert(
        orch, lost, run=inc.run, job_id=job.job_id, alert=forged, known_allocation=known
    )
    assert (refused.ok, refused.reason) == (False, "bad_signature"), refused


def test_the_genuine_alert_is_acted_on(world) -> None:
    """The gate lets the real thing through: the alerting job is cancelled, its suspect drained (last:
    it ends the module's job)."""
    job: SignedJob = world["job"]
    inc = _incident(world, job.alert, job.alert_key)
    runner.authenticate(world["orch"], world["client"], inc, node="n2")
    steps.open_record(world["orch"], inc)
    out = step_drain.drain(world["orch"], world["client"], inc, node="n2", policy=DrainPolicy(max_drains=10))
    assert out["node"] == "n2" and world["client"].node("n2").drain_flag
    steps.freeze(world["orch"], world["client"], inc, grace_s=0.1, timeout_s=60)
    assert world["client"].job(job.job_id).is_terminal
