"""sdc_incident's relaunch step: resubmit without the suspect node and wait until the job RUNS.

Only after the drain: an incident whose node was not drained skips; in approve mode that is a person's
Reject to `approve_drain` (the approval skips only `drain`, and this task's trigger rule runs it past
skipped upstreams), recorded as `drain_rejected`, status rejected.

With hot spares (act mode) the in-job path (incident/hot_spare.py) recovers inside the kept job first.
The relaunch job is tagged with the incident's DAG run, and its id is in the incident record before the
wait, so a retry reattaches to it instead of submitting twice; a job found by the tag alone is followed
only after a try that died between sbatch and that record. The RunSpec comes from relaunch_plan.py. Run by incident/runner.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from longrun import alert_auth
from longrun.incident import hot_spare, record, runbooks
from longrun.incident.events import Event
from longrun.incident.relaunch_plan import healthy_nodes, relaunch_spec
from longrun.incident.runner import Incident, IncidentSkip, Outcome, Rec, authenticate, run, write
from longrun.monitor.lifecycle import conf_of
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobLostError, JobNotFoundError
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from training.records.incident import RestartCheckpoint
from training.store.interface import ObjectStore

#: Incident record fields (kept as written by the typed record): the id of the relaunch job this incident
#: submitted last, and the tag of a submission begun but not yet recorded (null once recorded).
RELAUNCH_JOB_FIELD = "relaunch_job_id"
SUBMITTING_FIELD = "relaunch_submitting"


def _record_fields(store: ObjectStore, inc: Incident, fields: Mapping[str, Any]) -> None:
    record.update(store, run=inc.run, incident_id=inc.incident_id, change=lambda rec: rec.update(fields))


def _recorded_id(fields: Mapping[str, Any]) -> int | None:
    """The relaunch job id the incident record holds (`RELAUNCH_JOB_FIELD`), or None."""
    recorded = fields.get(RELAUNCH_JOB_FIELD)
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None


def recorded_job(store: ObjectStore, client: SlurmClient, inc: Incident) -> JobState | None:
    """The relaunch job this incident submitted, from its record, while the id still names that job
    (`ops.not_the_job`); None before a submission, or once Slurm lost or forgot it."""
    recorded = _recorded_id(inc.rec(store).extra)
    if recorded is None:
        return None
    tag = relaunch_tag(inc)
    try:
        state = client.job(recorded)
    except JobNotFoundError:
        return None
    return None if ops.not_the_job(state, tag_prefix=tag.prefix(), name=inc.run) else state


def relaunch_tag(inc: Incident) -> JobTag:
    """The tag of the incident's relaunch job (every submission of every try)."""
    return JobTag(dag_id="sdc_incident", run_id=inc.dag_run_id, task_id="relaunch")


#: How many relaunch jobs may be lost in a row (`Event.RELAUNCH_LOST`) before the step fails: each loss is a
#: controller that forgot a job it had accepted, so a third in a row is no passing restart.
MAX_SUBMISSIONS = 3


def relaunch(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str | None,
    checkpoint: Mapping[str, Any],
    make_job: Callable[[RunSpec, JobTag], JobSpec],
    running_timeout_s: float = 300.0,
    lost_after_s: float = ops.LOST_AFTER_S,
) -> dict[str, Any]:
    """The relaunch step: the runner (incident/runner.py) calls `done`, then `observe` or `act`.

    Why one function: `done`, `plan`, `observe` and `act` are the runner's callbacks for this one step and
    close over its arguments (the node, the picked checkpoint, `make_job`); `act` is long for its own
    reason (below)."""
    exclude = (node,) if node else ()

    def done(rec: Rec) -> dict[str, Any] | None:
        if rec.relaunch and record.has_event(rec, Event.RELAUNCHED_RUNNING):
            return rec.relaunch.to_json()  # the recorded object as it is (XCom unchanged)
        return None

    def plan() -> tuple[RunSpec, str]:
        resume_from = RestartCheckpoint.from_json(checkpoint).key  # the pick step's result
        free = healthy_nodes(client, inc, exclude=exclude)
        return relaunch_spec(inc, resume_from=resume_from, exclude=exclude, healthy=len(free))

    def observe(rec: Rec) -> Outcome:
        spec, note = plan()
        params = conf_of(spec)
        return Outcome(
            event=Event.WOULD_RELAUNCH,
            data={"params": params, "note": note},
            status=record.OBSERVED,
            result={"observe": True, "params": params, "note": note},
        )

    def act(rec: Rec) -> Outcome:
        """Act mode: recover inside the kept job, else resubmit without the suspect and wait for RUNNING.

        Why one function: it is one ordered sequence of Slurm calls and store writes (refuse an undrained
        node, the in-job path, end the kept job, authenticate, reattach to the recorded job or submit, bind
        and record it, wait for RUNNING while the id still names the job, submitting again when it does
        not, the outcome). Each part uses what the one before found, and a rerun depends on that order (the
        submitting mark, the bind, the recorded id before the wait), so it reads top to bottom."""
        if not record.has_event(rec, Event.DRAINED):
            # Our own check, not only the DAG's wiring: an approval operator skips just its direct
            # downstream on "Reject", and this task's trigger rule runs it past skipped upstreams (with no
            # checkpoint picked). A forged alert is still a security event first.
            authenticate(store, client, inc)
            if inc.plan.approval:  # approve mode: only "Reject" to approve_drain skips the drain
                write(store, inc, Outcome(event=Event.DRAIN_REJECTED, status=record.REJECTED))
            raise IncidentSkip(
                f"incident {inc.incident_id}: node {node} was not drained (a person rejected the drain, or"
                " the drain never ran), so nothing is relaunched: the job stays as it ended, the node in"
                " service"
            )
        # hot spares: recover inside the kept job; else end it for the full relaunch
        if (in_job := hot_spare.direct(store, client, inc, node=node, checkpoint=checkpoint)) is not None:
            return Outcome(result=in_job)  # hot_spare recorded it
        hot_spare.end_kept(store, client, inc)
        spec, note = plan()
        authenticate(store, client, inc)  # roll back only on an authentic alert
        tag = relaunch_tag(inc)

        def reattach_or_submit(given_up: list[int]) -> int:
            """The job this incident submitted (from its own record), or a new submission. Never a job
            found by its tag alone: the tag is Slurm's public `--comment`, which any job can carry, so a
            job holding it before this incident submitted is not this incident's."""
            raw = inc.rec(store).extra
            recorded = _recorded_id(raw)
            if recorded is not None and recorded not in given_up:
                return recorded  # an earlier try's submission: wait_for_own checks it is still that job
            if raw.get(SUBMITTING_FIELD) == tag.render():
                # An earlier try died after sbatch but before it recorded the id: the job may exist, found
                # only by its tag. The one window in which the tag is believed (docs/security.md).
                earlier = next((j for j in client.find_jobs(tag.prefix()) if j.job_id not in given_up), None)
                if earlier is not None and earlier.comment:
                    # the key is found through the bind only
                    alert_auth.bind(store, run=spec.run_name, tag=earlier.comment, job_id=earlier.job_id)
                    _record_fields(store, inc, {RELAUNCH_JOB_FIELD: earlier.job_id, SUBMITTING_FIELD: None})
                    return earlier.job_id
            _record_fields(store, inc, {SUBMITTING_FIELD: tag.render()})
            secrets = alert_auth.submit_env(store, run=spec.run_name, tag=tag.render(), env=os.environ)
            job_id = client.submit(make_job(spec, tag), secret_env=secrets)
            alert_auth.bind(store, run=spec.run_name, tag=tag.render(), job_id=job_id)
            # recorded now: a try that dies while waiting leaves the trace (and reattaches by the record)
            inc.event(
                store,
                Event.RELAUNCH_SUBMITTED,
                {RELAUNCH_JOB_FIELD: job_id, SUBMITTING_FIELD: None},
                job_id=job_id,
                exclude=list(spec.exclude),
                note=note,
            )
            return job_id

        # Follow the job only while its id still names it: a slurmctld killed right after sbatch answered
        # can forget the job and give its id to the next submission (the fault matrix saw the diagnosis
        # probe's allocation on the drained node take it). A lost job is submitted again, a bounded number
        # of times; the job now holding the id is never followed, let alone handed to the monitor.
        lost: list[str] = []
        given_up: list[int] = []
        state: JobState | None = None
        while state is None and len(lost) < MAX_SUBMISSIONS:
            job_id = reattach_or_submit(given_up)
            try:
                state = ops.wait_for_own(
                    client,
                    job_id,
                    lambda s: s.status is JobStatus.RUNNING or s.is_terminal,
                    tag_prefix=tag.prefix(),
                    name=spec.run_name,
                    timeout_s=running_timeout_s,
                    lost_after_s=lost_after_s,
                )
            except JobLostError as e:
                lost.append(str(e))
                given_up.append(job_id)
                # on the timeline once (events appear at most once); every loss is in the final event
                inc.event(store, Event.RELAUNCH_LOST, job_id=job_id, why=str(e))
        if state is None:
            return Outcome(
                event=Event.RELAUNCH_FAILED,
                data={"state": f"{len(lost)} submissions lost", "lost": lost},
                status=record.FAILED,
                stop=(
                    f"relaunch lost {len(lost)} submitted jobs in a row (last: {lost[-1]}); is slurmctld"
                    f" restarting? Runbook: {runbooks.RELAUNCH_FAILED}"
                ),
            )
        if state.status is not JobStatus.RUNNING and state.status is not JobStatus.COMPLETED:
            return Outcome(
                event=Event.RELAUNCH_FAILED,
                data={"state": state.describe()},
                status=record.FAILED,
                stop=f"relaunched job {state.describe()}. Runbook: {runbooks.RELAUNCH_FAILED}",
            )
        now = time.time()
        alert_time = float(inc.typed_alert.time or now)
        result = {
            "job_id": job_id,
            "nodes": list(state.nodes),
            "exclude": list(spec.exclude),
            "resume_from": spec.resume_from,
            "attempt": spec.attempt,
            "note": note,
            "params": conf_of(spec),
        }
        return Outcome(
            event=Event.RELAUNCHED_RUNNING,
            data={"job_id": job_id, "nodes": list(state.nodes), **({"lost": lost} if lost else {})},
            fields={"relaunch": result, "time_to_recover_s": round(now - alert_time, 3)},
            status=record.RELAUNCHED,
            result=result,
        )

    return run(store, inc, done=done, observe=observe, act=act)
