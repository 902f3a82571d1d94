"""A relaunch whose job Slurm lost is submitted again, and the job holding its id is never followed.

The fault matrix's relaunch x slurmctld cell saw it on the real stack: slurmctld was SIGKILLed 0.2 s after
accepting the relaunch's sbatch, before it saved the job; on restart it purged the job and gave its id to
the next submission, the diagnosis probe's allocation on the drained suspect. longrun then followed that
allocation as the relaunch ("relaunch on ['n2']") and handed it to the monitor, and the run failed.

Everything here is real (Slurm, the store, a signed alerting job, the drain, the freeze, the relaunch's
own submissions) except one thing: the relaunch step's first sbatch answer. `_IdGivenAway` answers with
the id of a job Slurm already gave to someone else, or with an id Slurm never had, instead of submitting:
that is what the step sees after the controller lost the job. No test can time slurmctld's unsaved state,
so only that answer is simulated; `LONGRUN_CHAOS=1 pytest tests/chaos/test_matrix.py -k relaunch-slurmctld`
is the real thing."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.signed_job import SignedJob, submit_signed_job
from longrun.health.ratelimit import DrainPolicy
from longrun.incident import relaunch_plan, runner, step_drain, step_relaunch, steps
from longrun.incident.events import Event
from longrun.run_identity import identities_from_env
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.errors import SlurmUnavailableError
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag

from training.records.incident import RestartCheckpoint
from training.store.factory import store_from_env

pytestmark = [pytest.mark.slurm, pytest.mark.s3]

#: Far above any id the test cluster hands out: Slurm has never known it.
NEVER_KNOWN_ID = 9_000_000


class _IdGivenAway:
    """The real client, except that its first `lost` submissions are never made: each answers `answer`,
    the id of a job Slurm gave to someone else (or one it never had), as sbatch's answer reads once the
    controller has lost the job it had just accepted."""

    def __init__(self, client: CliSlurmClient, answer: int, *, lost: int) -> None:
        self._client, self._answer, self._lost = client, answer, lost
        self.answered: list[int] = []

    def __getattr__(self, name: str):  # noqa: ANN204 - everything else is the real client
        return getattr(self._client, name)

    def submit(self, spec: JobSpec, *, secret_env=None) -> int:  # noqa: ANN001
        if len(self.answered) < self._lost:
            self.answered.append(self._answer)
            return self._answer
        job_id = self._client.submit(spec, secret_env=secret_env)
        self.answered.append(job_id)
        return job_id


@pytest.fixture
def world(slurm_cluster, s3_store_env, tmp_path: Path, monkeypatch) -> Iterator[dict]:
    """A signed job of a fresh run on n1+n2, its alert authenticated, n2 drained and the job frozen, as
    sdc_incident leaves them before the relaunch; and a job of someone else on n3 (named and tagged as the
    diagnosis probe's allocation is not). Everything is cancelled and n2 resumed at the end."""
    env = {**s3_store_env, **slurm_cluster.env}
    for k, val in env.items():
        monkeypatch.setenv(k, val)
    store = store_from_env(env)
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    run = f"lost-{uuid.uuid4().hex[:8]}"
    jobs: list[int] = []
    try:
        other = client.submit(
            JobSpec(
                name="someone-else",
                partition=slurm_cluster.partition,
                command=("sleep 300",),
                comment="not-longrun",
                nodelist=("n3",),
                gpus_per_node=0,
                exclusive=False,
                time_limit_min=5,
                workdir=str(tmp_path),
                output=f"{tmp_path}/other-%j.out",
            )
        )
        jobs.append(other)
        ops.wait_status(client, other, {JobStatus.RUNNING}, timeout_s=60)
        job: SignedJob = submit_signed_job(
            client, store, run=run, orch_env=env, workdir=tmp_path, partition=slurm_cluster.partition
        )
        jobs.append(job.job_id)
        inc = runner.Incident(
            run=run,
            alert_key=job.alert_key,
            alert=job.alert,
            job_id=job.job_id,
            run_params={"run_name": run, "nodes": 2, "gpus_per_node": 0, "incident_mode": "act"},
            dag_run_id=f"incident__{uuid.uuid4().hex[:6]}",
        )
        verdict = runner.authenticate(store, client, inc, node="n2")
        steps.open_record(store, inc, allocation=verdict.allocation)
        step_drain.drain(store, client, inc, node="n2", policy=DrainPolicy(max_drains=10))
        steps.freeze(store, client, inc, grace_s=0.1, timeout_s=60)

        def make_job(spec: RunSpec, tag: JobTag) -> JobSpec:
            return JobSpec(
                name=spec.run_name,
                partition=slurm_cluster.partition,
                command=("sleep 300",),
                comment=tag.render(),
                nodes=spec.nodes,
                exclude=spec.exclude,
                gpus_per_node=0,
                exclusive=False,
                time_limit_min=5,
                workdir=str(tmp_path),
                output=f"{tmp_path}/relaunch-%j.out",
            )

        yield {
            "store": store,
            "client": client,
            "inc": inc,
            "other": other,
            "jobs": jobs,
            "make_job": make_job,
        }
    finally:
        for tagged in client.find_jobs("longrun/sdc_incident/"):
            if tagged.comment.startswith("longrun/sdc_incident/") and tagged.name == run:
                jobs.append(tagged.job_id)
        for job_id in jobs:
            client.cancel(job_id)
        identities_from_env(env).revoke(run)
        if client.node("n2").drain_flag and client.node("n2").is_ours:
            client.resume("n2")


CHECKPOINT = RestartCheckpoint(step=0, key=None, why="a clean start").to_json()


@pytest.mark.parametrize("answer", ["another-job", "never-known"])
def test_a_lost_relaunch_is_submitted_again_and_the_job_holding_its_id_is_left_alone(world, answer) -> None:
    store, real, inc = world["store"], world["client"], world["inc"]
    lost_id = world["other"] if answer == "another-job" else NEVER_KNOWN_ID
    client = _IdGivenAway(real, lost_id, lost=1)
    out = step_relaunch.relaunch(
        store, client, inc, node="n2", checkpoint=CHECKPOINT, make_job=world["make_job"], lost_after_s=3.0
    )
    assert client.answered[0] == lost_id and len(client.answered) == 2, client.answered
    relaunched = real.job(int(out["job_id"]))
    assert out["job_id"] == client.answered[1] != lost_id
    assert relaunched.name == inc.run and relaunched.comment.startswith(
        f"longrun/sdc_incident/{inc.dag_run_id}/"
    )
    assert "n2" not in out["nodes"] and relaunched.status is JobStatus.RUNNING, relaunched
    timeline = inc.rec(store).timeline
    lost = [e for e in timeline if e.event == Event.RELAUNCH_LOST]
    assert [e.details["job_id"] for e in lost] == [lost_id], timeline
    why = "now carries the comment 'not-longrun'" if answer == "another-job" else "has not known the id"
    assert why in lost[0].details["why"], lost[0].details
    running = [e for e in timeline if e.event == Event.RELAUNCHED_RUNNING]
    assert [e.details["job_id"] for e in running] == [out["job_id"]]
    assert len(running[0].details["lost"]) == 1, running[0].details
    # the job that holds the lost id is someone else's: never followed, never touched
    assert real.job(world["other"]).status is JobStatus.RUNNING
    # a rerun of the step gives back what it recorded and submits nothing
    assert (
        step_relaunch.relaunch(
            store, client, inc, node="n2", checkpoint=CHECKPOINT, make_job=world["make_job"]
        )
        == out
        and len(client.answered) == 2
    )


def test_a_relaunch_lost_again_and_again_fails_the_incident_without_following_any(world) -> None:
    """Three losses in a row are no passing restart: the step fails (runbook), having followed none."""
    store, real, inc = world["store"], world["client"], world["inc"]
    client = _IdGivenAway(real, world["other"], lost=step_relaunch.MAX_SUBMISSIONS)
    with pytest.raises(runner.IncidentStop, match="relaunch lost 3 submitted jobs in a row"):
        step_relaunch.relaunch(
            store, client, inc, node="n2", checkpoint=CHECKPOINT, make_job=world["make_job"]
        )
    assert client.answered == [world["other"]] * step_relaunch.MAX_SUBMISSIONS
    timeline = inc.rec(store).timeline
    assert [e.event for e in timeline].count(Event.RELAUNCH_LOST) == 1  # an event is on the timeline once
    failed = next(e for e in timeline if e.event == Event.RELAUNCH_FAILED)
    assert len(failed.details["lost"]) == step_relaunch.MAX_SUBMISSIONS, failed.details
    assert Event.RELAUNCHED_RUNNING not in [e.event for e in timeline]
    assert real.job(world["other"]).status is JobStatus.RUNNING
    assert not real.find_jobs(f"longrun/sdc_incident/{inc.dag_run_id}/")  # nothing of ours was submitted


def test_a_job_carrying_the_relaunch_tag_before_the_incident_submitted_is_not_followed(world) -> None:
    """Slurm's `--comment` is public and any job may carry any: a job holding the relaunch's tag and the
    run's name before the step ran (an impostor; before, the step found it by the tag and followed it as
    the relaunch, never submitting) is left alone, and the step submits its own."""
    store, client, inc = world["store"], world["client"], world["inc"]
    impostor = client.submit(
        dataclasses.replace(
            world["make_job"](_spec_of(inc), step_relaunch.relaunch_tag(inc)), nodes=1, exclude=("n2",)
        )
    )
    world["jobs"].append(impostor)
    ops.wait_status(client, impostor, {JobStatus.RUNNING}, timeout_s=60)
    out = step_relaunch.relaunch(
        store, client, inc, node="n2", checkpoint=CHECKPOINT, make_job=world["make_job"]
    )
    assert out["job_id"] != impostor
    assert client.job(impostor).status is JobStatus.RUNNING  # not followed, not touched
    assert inc.rec(store).extra[step_relaunch.RELAUNCH_JOB_FIELD] == out["job_id"]


def test_a_retry_follows_the_job_its_record_names_and_submits_no_second(world) -> None:
    """A try that dies while its job pends leaves the job's id in the incident record; the retry waits on
    that job (while its id still names it) instead of submitting another."""
    store, client, inc = world["store"], world["client"], world["inc"]

    def pending(spec: RunSpec, tag: JobTag) -> JobSpec:  # on the drained suspect: pends, never starts
        return dataclasses.replace(world["make_job"](spec, tag), nodes=1, exclude=(), nodelist=("n2",))

    for _ in range(2):
        with pytest.raises(SlurmUnavailableError, match="condition not reached"):
            step_relaunch.relaunch(
                store, client, inc, node="n2", checkpoint=CHECKPOINT, make_job=pending, running_timeout_s=3
            )
    tagged = client.find_jobs(step_relaunch.relaunch_tag(inc).prefix())
    assert len(tagged) == 1, tagged
    assert inc.rec(store).extra[step_relaunch.RELAUNCH_JOB_FIELD] == tagged[0].job_id
    assert inc.rec(store).extra[step_relaunch.SUBMITTING_FIELD] is None


def _spec_of(inc: runner.Incident) -> RunSpec:
    return relaunch_plan.run_spec(inc).relaunch(resume_from=None, exclude=("n2",))
