"""Incidents close: relaunched and healthy for N steps, or closed by an operator with a reason.

A closed incident has status `closed`, a `closed` block {time, by, reason, healthy_steps} and a
`closed` timeline event. Retention then stops holding checkpoints for it (checkpoints/retention.py); the
run-health page shows it closed; `checkpoint_audit` closes the healthy ones before it audits.

Healthy means: the incident relaunched the run, the run's progress heartbeat is newer than the relaunch
and at least `healthy_steps` past the step it resumed from, and the run has raised no alert since the
relaunch. Progress and alerts are written by the job: a job can make its own incident close early
(retention may then free checkpoints that incident held); it cannot drain, cancel or return anything so.

Closing a drill's incident ends the drill: its sick-node marker is removed, its grant ended, and the
timeline says so (`drill_ended`, longrun.incident.drill_state). A job that closes its drill's incident
early only ends the drill sooner.
"""

from __future__ import annotations

import json
import time
from typing import Any

from longrun.incident import drill_state, record
from longrun.incident.events import Event
from longrun.runview import list_runs
from training.records import schema
from training.records.alert import AlertRef
from training.records.job import Progress
from training.records.orchestrator import Incident as IncidentRecord
from training.records.orchestrator import IncidentStatus
from training.store.interface import NotFound, ObjectStore

CLOSED = IncidentStatus.CLOSED
#: Steps past the resume point, without an alert, after which a relaunched incident closes (the default;
#: `checkpoint_audit`'s Param `healthy_steps`, else the Variable below, overrides it).
HEALTHY_STEPS = 20
HEALTHY_STEPS_VARIABLE = "longrun_healthy_steps"
MAX_HEALTHY_STEPS = 1_000_000


def healthy_steps_setting(raw: object, *, source: str) -> int:
    """The closing threshold from a Param or Variable value (None: the default); ValueError names `source`."""
    if raw is None or raw == "":
        return HEALTHY_STEPS
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= MAX_HEALTHY_STEPS:
        raise ValueError(f"{source}={raw!r}: expected an integer 1..{MAX_HEALTHY_STEPS}")
    return raw


def _set_closed(store: ObjectStore, run: str, incident_id: str, block: dict[str, Any]) -> dict[str, Any]:
    """Close the incident; if it is a drill's incident, the drill ends with it (its fault state removed,
    longrun.incident.drill_state). The record afterwards."""

    def change(r: dict[str, Any]) -> None:
        if r.get("status") == CLOSED:
            return  # closed before: keep the first closing
        r["status"] = CLOSED
        r["closed"] = block
        r["timeline"].append({"event": Event.CLOSED.value, "time": block["time"], "by": block["by"]})

    rec = record.update(store, run=run, incident_id=incident_id, change=change)
    job_id = rec.get("alert", {}).get("job_id")  # the verified alert's job (the incident opened on it)
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        job_id = None
    ended = drill_state.end(store, run=run, incident_id=incident_id, job_id=job_id)
    return ended if ended is not None else rec


def close(store: ObjectStore, *, run: str, incident_id: str, by: str, reason: str) -> dict[str, Any]:
    """An operator closes an incident; `reason` is required (it goes into the record)."""
    schema.check_run_name(run)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason: an operator closes an incident with a reason")
    if not isinstance(by, str) or not by.strip():
        raise ValueError("by: name who closes the incident")
    block = {
        "time": time.time(),
        "by": by.strip()[:128],
        "reason": reason.strip()[:1000],
        "healthy_steps": None,
    }
    return _set_closed(store, run, incident_id, block)


def _progress(store: ObjectStore, run: str) -> Progress | None:
    try:
        return Progress.from_json(json.loads(store.get_bytes(schema.store_key(run, schema.PROGRESS_PATH))))
    except (NotFound, ValueError, schema.SchemaError):
        return None


def _alert_after(store: ObjectStore, run: str, since: float) -> bool:
    for info in store.list(schema.store_key(run, "alerts/")):
        try:
            alert = json.loads(store.get_bytes(info.key))
        except (NotFound, ValueError):
            continue
        t = AlertRef.from_json(alert).time  # any alert with a time counts, whole or not
        if t is not None and t > since:
            return True
    return False


def healthy_why(store: ObjectStore, rec: IncidentRecord, healthy_steps: int) -> str | None:
    """Why a relaunched incident may close now, or None."""
    if rec.status != record.RELAUNCHED:
        return None
    relaunched = rec.event(Event.RELAUNCHED_RUNNING)
    if relaunched is None or relaunched.time is None:
        return None
    resume_step = int(rec.checkpoint.step or 0)
    prog = _progress(store, rec.run)
    if prog is None or prog.time <= relaunched.time or prog.step < resume_step + healthy_steps:
        return None
    if _alert_after(store, rec.run, relaunched.time):
        return None
    return f"relaunched, step {prog.step} reached ({healthy_steps}+ past {resume_step}), no alert since"


def close_healthy(store: ObjectStore, run: str, *, healthy_steps: int = HEALTHY_STEPS) -> list[str]:
    """Close every incident of `run` that is healthy; the ids closed now."""
    closed = []
    for key_info in store.list(schema.store_key(run, "incidents/")):
        rel = key_info.key.rsplit("/incidents/", 1)[-1]
        if "/" in rel or not rel.endswith(".json"):
            continue  # attachments (plots) of an incident
        try:
            rec = IncidentRecord.from_json(record.load(store, run=run, incident_id=rel[: -len(".json")]))
        except (NotFound, ValueError, schema.SchemaError):
            continue
        why = healthy_why(store, rec, healthy_steps)
        if why is None:
            continue
        block = {"time": time.time(), "by": "longrun", "reason": why, "healthy_steps": healthy_steps}
        _set_closed(store, run, rec.incident_id, block)
        closed.append(rec.incident_id)
    return closed


def close_all_healthy(store: ObjectStore, *, healthy_steps: int = HEALTHY_STEPS) -> list[str]:
    """close_healthy over every run (one with no incidents closes nothing); `run/incident` of each closed
    now."""
    # One folder listing of runs/ and one listing of each run's incidents/ (close_healthy), never a
    # listing of every run's check batches (ranks x steps).
    runs = list_runs(store)
    out = []
    for run in runs:
        try:
            schema.check_run_name(run)
        except schema.SchemaError:
            continue
        out += [f"{run}/{i}" for i in close_healthy(store, run, healthy_steps=healthy_steps)]
    return out
