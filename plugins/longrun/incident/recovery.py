"""Time to recover, measured to training again, and the proof that a relaunch resumed where it should.

Everything here is read from records, never computed from the plan: the trainer's segment records
(where each incarnation started, its first healthy step, where it ended) and fault records (when a
drill's fault fired), the alert record and the incident's timeline. The headline figure is
alert written -> first healthy step of the relaunch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from longrun.incident.events import Event
from training import schema
from training.records import Incident as IncidentRecord
from training.segment import FAULTS_DIR, SEGMENTS_DIR, FaultFired, Segment, last_trained, lost_steps, ordered
from training.store import ObjectStore, StoreError

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


def _read_all(store: ObjectStore, run: str, folder: str) -> list[bytes]:
    out = []
    for info in store.list(schema.store_key(run, folder)):
        if info.key.endswith(".json"):
            try:
                out.append(store.get_bytes(info.key))
            except StoreError as e:
                log.warning("record %s unreadable: %s", info.key, e)
    return out


def segments(store: ObjectStore, run: str) -> list[Segment]:
    """The run's segments in the order they ran; a malformed record is logged and left out."""
    found = []
    for raw in _read_all(store, run, SEGMENTS_DIR):
        try:
            found.append(Segment.from_json(raw))
        except ValueError as e:
            log.warning("segment record of run %s refused: %s", run, e)
    return ordered([s for s in found if s.run == run])


def faults(store: ObjectStore, run: str) -> list[FaultFired]:
    found = []
    for raw in _read_all(store, run, FAULTS_DIR):
        try:
            found.append(FaultFired.from_json(raw))
        except ValueError as e:
            log.warning("fault record of run %s refused: %s", run, e)
    return sorted((f for f in found if f.run == run), key=lambda f: f.time)


def segment_table(segs: list[Segment]) -> list[dict[str, Any]]:
    """One row per segment for the run report: where it started, what it trained, how it ended."""
    rows = []
    for i, s in enumerate(segs):
        before = last_trained(segs[:i])
        rows.append(
            {
                "segment": s.segment_id,
                "job_id": s.job_id,
                "restart_count": s.restart_count,
                "start_step": s.start_step,
                "resumed_from": s.resumed_from,
                "first_step": s.first_step,
                "first_healthy_step": s.first_healthy_step,
                "last_step": s.last_step,
                "exit": s.exit,
                "nodes": sorted(set(s.nodes)),
                "lost_steps_before": lost_steps(before, s) if before else None,
            }
        )
    return rows


def job_step(seg: Segment) -> str:
    """`<job>.<step>` of a segment id: an NVRx in-job restart keeps it, a relaunch inside the job does not."""
    return seg.segment_id.rsplit("-r", 1)[0]


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
    from longrun.incident import record as incident_record

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


class DrillNotFired(RuntimeError):
    """A drill run ended without its fault ever being injected: it proved nothing."""


def drill_outcome(drill_flag: str | None, fired: list[FaultFired]) -> dict[str, Any] | None:
    """Did the run's drill (`KIND:STEP:TARGET`) fire? None for a run without a drill."""
    if not drill_flag:
        return None
    mine = [f for f in fired if f.spec == drill_flag]
    return {
        "drill": drill_flag,
        "fired": bool(mine),
        "step": mine[0].step if mine else None,
        "nodes": sorted({f.node for f in mine}),
        "time": mine[0].time if mine else None,
    }
