"""Time to recover, measured to training again, and the proof that a relaunch resumed where it should.

Everything here is read from records, never computed from the plan: the trainer's segment and fault
records (longrun.monitor.segments), the alert record and the incident's timeline. The headline figure is
alert written -> first healthy step of the relaunch; `record` puts it on the incident's record when the
relaunched run finishes (longrun.tasks.training_run).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from longrun.incident import record as incident_record
from longrun.incident.events import Event
from longrun.monitor.segments import faults, job_step, segments
from training.records.orchestrator import Incident as IncidentRecord
from training.segment import FaultFired, Segment, last_trained, lost_steps
from training.store.interface import ObjectStore

log = logging.getLogger("longrun.incident.recovery")

#: The milestones of one recovery, in order (timeline event names where the incident records them).
MILESTONES = (
    "fault_injected",
    "alert_written",
    Event.ALERT_SEEN.value,
    Event.DRAINED.value,
    Event.RELAUNCH_SUBMITTED.value,
    Event.RELAUNCHED_RUNNING.value,
    Event.FIRST_HEALTHY_STEP.value,
)


def relaunch_segment(segs: list[Segment], incident: IncidentRecord) -> Segment | None:
    """The first segment of the relaunch after `incident`: of the relaunched job if known, else the first
    segment that started after the alert. A relaunch inside the kept job (a hot spare) is a new job step:
    an NVRx in-job restart of the step that raised the alert (NVRx 0.4.1 can restart the workers before
    the SDC stop closes its rendezvous) starts after the alert in the same job, and is not the relaunch."""
    alert_time = float(incident.alert["time"])
    job_id = incident.relaunch.job_id
    after = [s for s in segs if s.started_at > alert_time]
    if job_id is not None:
        after = [s for s in after if s.job_id == str(job_id)]
        if incident.relaunch.in_job:
            earlier = {job_step(s) for s in segs if s.started_at <= alert_time and s.job_id == str(job_id)}
            after = [s for s in after if job_step(s) not in earlier]
    return after[0] if after else None


def measure(incident: IncidentRecord, segs: list[Segment], fired: list[FaultFired]) -> dict[str, Any]:
    """The recovery of one incident from the records: milestone times (s after the alert record), the
    resume proof (first step after the relaunch vs the pick) and lost steps read from the segments."""
    alert_time = float(incident.alert["time"])
    times: dict[str, float | None] = dict.fromkeys(MILESTONES)
    before_alert = [f.time for f in fired if f.time <= alert_time]
    times["fault_injected"] = max(before_alert) if before_alert else None
    times["alert_written"] = alert_time
    for e in incident.timeline:
        if e.time is None:
            continue  # the oldest records named events without a time: no milestone
        if e.event in times and times[e.event] is None:
            times[e.event] = e.time
        if e.event == Event.DIRECTIVE_WRITTEN and times[Event.RELAUNCH_SUBMITTED] is None:
            times[Event.RELAUNCH_SUBMITTED] = e.time
    after = relaunch_segment(segs, incident)
    if after is not None:
        times[Event.FIRST_HEALTHY_STEP] = after.first_healthy_time
    previous = last_trained([s for s in segs if after is not None and s.started_at < after.started_at])
    pick_step = incident.checkpoint.step
    first_step = after.first_step if after else None
    healthy_at = times[Event.FIRST_HEALTHY_STEP]
    out: dict[str, Any] = {
        "milestones_s": {k: None if t is None else round(t - alert_time, 3) for k, t in times.items()},
        "alert_to_first_healthy_step_s": None if healthy_at is None else round(healthy_at - alert_time, 3),
        "relaunch_segment": after.segment_id if after else None,
        "pick_step": pick_step,
        "start_step": after.start_step if after else None,
        "first_step": first_step,
        "resumed_as_picked": (
            None if first_step is None or pick_step is None else first_step == int(pick_step) + 1
        ),
        "lost_steps": lost_steps(previous, after) if previous and after else None,
    }
    return out


def record(store: ObjectStore, run: str, incident_id: str) -> dict[str, Any] | None:
    """Measure the recovery of an incident and put it on its record (event `first_healthy_step`, field
    `recovery`); a rerun changes nothing once the event is there. None when the relaunch has not
    trained a healthy step yet."""
    rec = incident_record.load_typed(store, run=run, incident_id=incident_id)
    if rec.recovery and incident_record.has_event(rec, Event.FIRST_HEALTHY_STEP):
        return rec.recovery.to_json()
    result = measure(rec, segments(store, run), faults(store, run))
    after = relaunch_segment(segments(store, run), rec)
    if after is None or after.first_healthy_time is None:
        return None
    incident_record.add_event(
        store,
        run=run,
        incident_id=incident_id,
        name=Event.FIRST_HEALTHY_STEP,
        fields={"recovery": result},
        time=after.first_healthy_time,
        step=after.first_healthy_step,
        segment=after.segment_id,
    )
    log.info("incident %s: recovery %s", incident_id, json.dumps(result, sort_keys=True))
    return result
