"""The steps of `sdc_incident` that are small enough to live together, as plain functions over a store and
a Slurm client (no Airflow here).

Each step keeps only its action; incident/runner.py runs it (load the record, skip what an earlier try
did, observe mode's would_..., act, record one Outcome), so rerunning a task or the whole DAG run never
drains twice, never submits twice and never loses the record. Each returns a small dict for XCom and the
task log. Event names: incident/events.py. The steps, in order, and where each is defined:

    open       (here)           the record, keyed by the alert
    freeze     (here)           cancel the job if it still runs (an SDC verdict normally ended it)
    attribute  (here)           one node, or ambiguous -> IncidentStop (drain nothing; see the runbook)
    drain      step_drain.py    rate-limited, with longrun's reason, only if not drained by us already
    diagnose   step_diagnose.py reference probe on a healthy idle node, then node_check on the drained node
                                (hot_spare.py: inside the kept job, when there is one)
    pick       (here)           the pre-incident checkpoint (and demote what came after the last good step)
    relaunch   step_relaunch.py the relaunched job: resumed, drill off, the node excluded; waits until RUNNING

Callers import each step from the module that defines it.
"""

from __future__ import annotations

import logging
from typing import Any

from longrun.checkpoints.pick import pick_pre_incident, plan_pick
from longrun.checkpoints.promote import mark_suspect
from longrun.incident import attribution, hot_spare, record
from longrun.incident.events import Event
from longrun.incident.runner import Incident, Outcome, Rec, authenticate, run, write
from longrun.monitor.gate import gate_pending
from longrun.monitor.lifecycle import spec_from_params
from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobNotFoundError, SlurmError
from training.records.orchestrator import Incident as IncidentRecord
from training.store.interface import ObjectStore

log = logging.getLogger("longrun.sdc_incident")


def open_record(store: ObjectStore, inc: Incident, *, allocation: tuple[str, ...] = ()) -> dict[str, Any]:
    """Open the incident's record (once). `allocation`: the job's nodes as the open step's check of the
    alert saw them, recorded once (`authenticated`): later checks count them even after Slurm has lost
    them (runner.authenticate)."""
    raw = record.open_incident(store, run=inc.run, alert=inc.alert, alert_key=inc.alert_key, mode=inc.mode)
    rec = IncidentRecord.from_json(raw)
    if inc.alert_seen_at is not None and not record.has_event(rec, Event.ALERT_SEEN):
        seen = Outcome(event=Event.ALERT_SEEN, at=float(inc.alert_seen_at))
        rec = IncidentRecord.from_json(write(store, inc, seen))
    if allocation and not record.has_event(rec, Event.AUTHENTICATED):
        checked = Outcome(event=Event.AUTHENTICATED, data={"allocation": list(allocation)})
        rec = IncidentRecord.from_json(write(store, inc, checked))
    status = None if rec.status is None else str(rec.status)  # the text on the record
    return {"incident_id": rec.incident_id, "mode": rec.mode, "status": status}


def freeze(
    store: ObjectStore, client: SlurmClient, inc: Incident, *, grace_s: float = 120.0, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Make sure the job no longer runs (a drained node would keep running it). A job that reached an SDC
    verdict ends by itself (exit 93) once its background checkpoint uploads are done: give it `grace_s`
    before cancelling, so the pre-incident checkpoint is not cut off mid-upload."""

    def done(rec: Rec) -> dict[str, Any] | None:
        if e := rec.event(Event.FROZEN):
            return {"job_id": inc.job_id, "already": True, "state": e.details.get("state")}
        return None

    def frozen(state: str) -> Outcome:
        return Outcome(
            event=Event.FROZEN, data={"state": state}, result={"job_id": inc.job_id, "state": state}
        )

    def act(rec: Rec) -> Outcome:
        authenticate(store, client, inc)  # cancel only the job the signed alert came from, and only ours
        if inc.job_id is None:
            return frozen("no job id known")
        if (kept := hot_spare.freeze_kept(store, client, inc)) is not None:  # hot spares: the job stays
            return Outcome(result=kept)  # hot_spare recorded it
        try:
            state = client.job(inc.job_id)
        except JobNotFoundError:
            return frozen("unknown to Slurm")
        if state.is_active:
            try:
                state = ops.wait_for(
                    client, inc.job_id, lambda s: s.is_terminal, timeout_s=grace_s, poll_s=1.0
                )
            except SlurmError:
                pass  # still running after the grace period
        if state.is_active:
            if not inc.plan.changes:  # observe: what act would cancel depends on what is found here
                desc = state.describe()
                return Outcome(
                    event=Event.WOULD_FREEZE,
                    data={"state": desc},
                    result={"job_id": inc.job_id, "state": desc, "observe": True},
                )
            client.cancel(inc.job_id)
            state = ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=timeout_s)
        return frozen(state.describe())

    return run(store, inc, done=done, act=act)


def attribute(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    def act(rec: Rec) -> Outcome:
        att = attribution.attribute(inc.alert)
        return Outcome(
            event=Event.ATTRIBUTED,
            data={"verdict": att.verdict, "node": att.node},
            fields={"attribution": att.to_dict()},
            status=record.AMBIGUOUS if att.ambiguous else None,
            runbook=att.runbook,
            result=att.to_dict(),
            stop=(
                f"AMBIGUOUS evidence, suspect software: {att.reason}. Nothing was drained. Runbook: {att.runbook}"
                if att.ambiguous
                else None
            ),
        )

    return run(store, inc, act=act)  # no `done`: the attribution is recomputed and recorded again


def gate_left(store: ObjectStore, inc: Incident) -> None:
    """Gate the checkpoints from before the alert's step that nobody has gated yet: the ones the job wrote
    after the monitor's last look, or was still uploading then. The normal checkpoint gate, not an
    incident action, so observe mode runs it too; a checkpoint already gated is not read again. The
    freeze calls it (beside the attribution and the drain), the pick again for any that came later."""
    gate_pending(store, inc.run, before_step=inc.step, log=log, by=f"sdc_incident:{inc.incident_id}")


def checks_run_by(inc: Incident) -> tuple[str, ...] | None:
    """The checks the alerted launch runs, from the orchestrator's own launch record (`inc.run_params`);
    None when those params do not read as a run (then the pick counts every check of the class)."""
    try:
        return spec_from_params(inc.run_params).checks_run()
    except ValueError:
        return None


def pick(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    """The checkpoint to resume from; demotes the checkpoints after the last known-good step."""

    def done(rec: Rec) -> dict[str, Any] | None:
        # the recorded object as it is (XCom unchanged), once it reads as a restart checkpoint
        return rec.checkpoint.to_json() if rec.checkpoint else None

    def act(rec: Rec) -> Outcome:  # observe mode too: it changes nothing on the cluster
        gate_left(store, inc)  # the job is final now: what it was still uploading at the freeze too
        checks_run = checks_run_by(inc)
        plan = plan_pick(store, inc.run, inc.alert, checks_run=checks_run)
        if inc.plan.changes:
            step, why = pick_pre_incident(store, inc.run, inc.alert, write=True, checks_run=checks_run)
            lkg = [s for s in (plan.get("last_known_good") or {}).values() if isinstance(s, int)]
            if lkg:
                mark_suspect(
                    store,
                    inc.run,
                    min(lkg),
                    f"incident {inc.incident_id}: {inc.alert['check']} at step {inc.step}",
                    incident_id=inc.incident_id,
                )
        else:
            step, why = plan["step"], plan["why"]
        if step is None:
            why += "; restarting from step 0 (a clean start is always from before the fault)"
        resume_step = int(step or 0)
        chosen = {"step": resume_step, "key": plan.get("key") if step is not None else None, "why": why}
        lost = record.lost_steps(alert_step=inc.step, checkpoint_step=resume_step)
        return Outcome(
            event=Event.PICKED,
            data={"step": chosen["step"]},
            fields={"checkpoint": chosen, "lost_steps": lost},
            result={**chosen, "lost_steps": lost},
        )

    return run(store, inc, done=done, act=act)
