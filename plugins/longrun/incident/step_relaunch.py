"""sdc_incident's relaunch step: resubmit without the suspect node and wait until the job RUNS.

Only after the drain: an incident whose node was not drained skips; in approve mode that is a person's
Reject to `approve_drain` (the approval skips only `drain`, and this task's trigger rule runs it past
skipped upstreams), recorded as `drain_rejected`, status rejected.

With hot spares (act mode) the in-job path (incident/hot_spare.py) recovers inside the kept job first.
The relaunch job is tagged with the incident's DAG run, so a retry reattaches instead of submitting
twice. The RunSpec comes from relaunch_plan.py. Run by incident/runner.py.
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
from longrun.slurm.errors import JobLostError
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from training.records.incident import RestartCheckpoint
from training.store.interface import ObjectStore

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
        node, the in-job path, end the kept job, authenticate, reattach by the tag or submit and bind,
        wait for RUNNING while the id still names the job, submitting again when it does not, the outcome).
        Each part uses what the one before found, and a rerun depends on
        that order (the tag, the bind, `relaunch_submitted` before the wait), so it reads top to bottom."""
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
        tag = JobTag(dag_id="sdc_incident", run_id=inc.dag_run_id, task_id="relaunch")

        def reattach_or_submit() -> int:
            earlier = next(iter(client.find_jobs(tag.prefix())), None)
            if earlier is not None:
                if earlier.comment:
                    # a try that died between the submit and the bind: the key is found through the bind only
                    alert_auth.bind(store, run=spec.run_name, tag=earlier.comment, job_id=earlier.job_id)
                return earlier.job_id
            secrets = alert_auth.submit_env(store, run=spec.run_name, tag=tag.render(), env=os.environ)
            job_id = client.submit(make_job(spec, tag), secret_env=secrets)
            alert_auth.bind(store, run=spec.run_name, tag=tag.render(), job_id=job_id)
            # recorded now: a try that dies while waiting leaves the trace (and reattaches by the tag)
            inc.event(store, Event.RELAUNCH_SUBMITTED, job_id=job_id, exclude=list(spec.exclude), note=note)
            return job_id

        # Follow the job only while its id still names it: a slurmctld killed right after sbatch answered
        # can forget the job and give its id to the next submission (the fault matrix saw the diagnosis
        # probe's allocation on the drained node take it). A lost job is submitted again, a bounded number
        # of times; the job now holding the id is never followed, let alone handed to the monitor.
        lost: list[str] = []
        state: JobState | None = None
        while state is None and len(lost) < MAX_SUBMISSIONS:
            job_id = reattach_or_submit()
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
