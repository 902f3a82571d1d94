"""The incident record: one JSON object per alert under the run's incidents/, never lost, never doubled.

Keyed by the alert (its key's file stem is the incident id: training.records.schema.incident_id_for),
created with If-None-Match and changed only with If-Match, so a rerun task, a rerun DAG or two
schedulers racing all land on the same record. Timeline events are named; adding an event that is
already there is a no-op (a rerun does not add a second "drained"), which is also how the tasks know
what has been done.

Fields beyond the shared schema's (run, incident_id, alert, timeline, mode): alert_key, status,
attribution, drain, diagnosis, checkpoint (step, key, why), lost_steps, relaunch, time_to_recover_s,
runbooks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from longrun.incident import runbooks
from longrun.incident.events import Event
from training.records import schema
from training.records.alert import Alert, AlertRef
from training.records.orchestrator import Incident as IncidentRecord
from training.records.orchestrator import IncidentStatus
from training.store.interface import NotFound, ObjectStore, dump_json
from training.store.update import UpdateConflict, create_or_read, update_json

MAX_ATTEMPTS = 8

# status values (one definition: training.records.IncidentStatus), in the order an incident moves
OPEN = IncidentStatus.OPEN
AMBIGUOUS = IncidentStatus.AMBIGUOUS  # suspect software: nothing drained
OBSERVED = IncidentStatus.OBSERVED  # observe mode: recorded what would be done
REJECTED = IncidentStatus.REJECTED  # approve mode: an operator said no
RELAUNCHED = IncidentStatus.RELAUNCHED
FAILED = IncidentStatus.FAILED


def record_key(run: str, incident_id: str) -> str:
    return schema.store_key(run, schema.incident_path(incident_id))


def _now() -> float:
    return time.time()


def open_incident(
    store: ObjectStore, *, run: str, alert: Mapping[str, Any], alert_key: str, mode: str
) -> dict[str, Any]:
    """Create the record for `alert` (or return the one a previous try created)."""
    incident_id = schema.incident_id_for(alert_key)
    key = record_key(run, incident_id)
    ref = AlertRef.from_json(alert)  # the monitor handed over a whole alert; its copy is kept as is
    rec = schema.record(
        "incident",
        run=run,
        incident_id=incident_id,
        alert=dict(alert),
        alert_key=alert_key,
        timeline=[{"event": Event.OPENED.value, "time": _now(), "alert_time": ref.time}],
        mode=mode,
        status=OPEN,
        runbooks=[runbooks.for_check(str(ref.check))],
    )
    first = create_or_read(store, key, dump_json(rec))
    if first.created:
        return rec
    return _checked(json.loads(first.data))


def load(store: ObjectStore, *, run: str, incident_id: str) -> dict[str, Any]:
    return _checked(json.loads(store.get_bytes(record_key(run, incident_id))))


def _checked(rec: Any) -> dict[str, Any]:
    schema.validate("incident", rec)
    return rec


def update(
    store: ObjectStore, *, run: str, incident_id: str, change: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Apply `change` to the stored record with a conditional write; re-read and retry if someone else won.

    `change` edits the JSON in place and must be safe to call more than once (it may run again on a
    fresh copy). A change that leaves the record's bytes as they were writes nothing. FileNotFoundError
    when there is no record; RuntimeError after MAX_ATTEMPTS lost races (training.store.update)."""
    key = record_key(run, incident_id)

    def apply(rec: dict[str, Any]) -> dict[str, Any]:
        change(rec)
        return _checked(rec)

    try:
        return update_json(
            store, key, apply, dump=dump_json, attempts=MAX_ATTEMPTS, what="incident record"
        ).value
    except NotFound:
        raise FileNotFoundError(f"incident record {key} does not exist in {store.describe()}") from None
    except UpdateConflict:
        raise RuntimeError(
            f"incident record {key} kept changing under us ({MAX_ATTEMPTS} attempts)"
        ) from None


def load_typed(store: ObjectStore, *, run: str, incident_id: str) -> IncidentRecord:
    """The record as the typed `training.records.Incident` (what readers use; writers change the JSON)."""
    return IncidentRecord.from_json(load(store, run=run, incident_id=incident_id))


def has_event(rec: IncidentRecord, name: Event) -> bool:
    """`name` is on the timeline (it is there at most once)."""
    return rec.event(name) is not None


def on_timeline(raw: Mapping[str, Any], name: Event) -> bool:
    """`has_event` on the stored JSON, for a writer's `change` (it edits the JSON, so the record is
    written back as it was read) and for a reader that must not fail on a part that does not read."""
    return any(isinstance(e, Mapping) and e.get("event") == name for e in raw.get("timeline", ()))


def add_event(
    store: ObjectStore,
    *,
    run: str,
    incident_id: str,
    name: Event,
    fields: Mapping[str, Any] | None = None,
    **data: Any,
) -> dict[str, Any]:
    """Append timeline event `name` (once) with `data`, and merge `fields` into the record."""
    return update(
        store,
        run=run,
        incident_id=incident_id,
        change=lambda rec: apply_event(rec, name, fields=fields, data=data),
    )


def apply_event(
    rec: dict[str, Any],
    name: Event | None,
    *,
    fields: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    at: float | None = None,
) -> None:
    """A writer's change of the stored JSON: append event `name` (once; None: no event) at `at` (None:
    now) with `data`, and merge `fields` into the record."""
    if name is not None and not on_timeline(rec, name):
        rec["timeline"].append({"event": str(name), "time": _now() if at is None else at, **(data or {})})
    if fields:
        rec.update(fields)


def add_runbook(rec: dict[str, Any], path: str) -> None:
    books = rec.setdefault("runbooks", [])
    if path not in books:
        books.append(path)


def lost_steps(*, alert_step: int, checkpoint_step: int) -> int:
    """Steps that are trained again: from the checkpoint to the alert's step, that step included."""
    if checkpoint_step > alert_step:
        raise ValueError(f"checkpoint_step={checkpoint_step} is after alert_step={alert_step}")
    return alert_step - checkpoint_step


def summary(rec: IncidentRecord | Mapping[str, Any]) -> str:
    """Lines for the task log: what happened, what was done, what to read next."""
    r = rec if isinstance(rec, IncidentRecord) else IncidentRecord.from_json(rec)
    alert = Alert.from_json(r.alert)
    lines = [
        f"incident {r.incident_id} of run {r.run} ({r.status}, mode {r.mode})",
        f"  alert: {alert.check} at step {alert.step}, suspect nodes {list(alert.suspect_nodes)}"
        f" ranks {list(alert.suspect_ranks)}",
    ]
    if att := r.attribution:
        lines.append(f"  attribution: {att.verdict} {att.node or ''} - {att.reason}")
    if diag := r.diagnosis:
        lines.append(f"  diagnosis: {diag.verdict} - {diag.summary}")
    if ck := r.checkpoint:
        lines.append(f"  checkpoint: step {ck.step} ({ck.why})")
    if r.lost_steps is not None:
        lines.append(f"  lost steps: {r.lost_steps}")
    if rl := r.relaunch:
        nodes, exclude = (None if x is None else list(x) for x in (rl.nodes, rl.exclude))
        lines.append(f"  relaunch: job {rl.job_id} on {nodes} excluding {exclude}")
    if r.time_to_recover_s is not None:
        lines.append(f"  alert -> relaunched RUNNING: {r.time_to_recover_s:.1f} s")
    t0 = (r.timeline[0].time or 0.0) if r.timeline else 0.0
    for e in r.timeline:
        lines.append(f"    +{(e.time or 0.0) - t0:7.2f}s {e.event}")
    for book in r.runbooks:
        lines.append(f"  runbook: {book}")
    return "\n".join(lines)
