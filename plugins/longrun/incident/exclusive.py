"""At most one incident per run acts at a time; a second one joins the first or waits for it.

One SDC verdict can produce several alerts (two checks fire, two ranks write, a retry re-reads), and each
alert starts its own `sdc_incident` run. Two of them acting at once would cancel, drain and relaunch
twice. So an incident takes the run's lock (`runs/<run>/incident-lock.json`, orchestrator side, created
only if absent) before it acts:

- the lock is free, or already ours (a retried task): act;
- another incident holds it for the *same job*: that incident freezes the job and relaunches the run;
  this one joins it (records whom it joined) and does nothing else;
- another incident holds it for another job of the run (an alert of the relaunched job while the first
  incident still finishes): wait, bounded, then act.

The holder releases the lock in its summary task (which runs whatever happened). A lock whose incident
record has reached a final status, or older than LOCK_TTL_S, counts as free: a crashed incident never
blocks the run for good. A holder record that does not read (not JSON, not an incident record) says
nothing about its status, so it never frees the lock: until the TTL, the newcomer waits (it does not
join: it could not write the record either) and says which key to fix.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from longrun.incident import record, runbooks
from training.records import schema
from training.records.base import Declared
from training.records.fields import (
    Field,
    epoch_seconds,
    non_empty,
    opt_float,
    opt_int,
    opt_str,
    run_name,
    slurm_job_id,
)
from training.records.orchestrator import IncidentStatus
from training.records.schema import SchemaError
from training.store.interface import NotFound, ObjectStore, dump_json, put_json
from training.store.update import UpdateConflict, update_json

LOCK_PATH = "incident-lock.json"
SCHEMA_VERSION = 1
LOCK_TTL_S = 6 * 3600.0
FINAL_STATUSES = frozenset(
    {
        record.AMBIGUOUS,
        record.OBSERVED,
        record.REJECTED,
        record.RELAUNCHED,
        record.FAILED,
        IncidentStatus.CLOSED,
    }
)
JOIN_WAIT_S = 120.0  # the holder writes its record right after taking the lock

log = logging.getLogger("longrun.sdc_incident")


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentLock(Declared):
    """Which incident acts for a run, on which job."""

    KIND = "incident_lock"
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "incident_id": Field(opt_str, checks=(non_empty,)),
        # always written, null when the alert named no job
        "job_id": Field(opt_int, need=False, present=True, checks=(slurm_job_id,)),
        "acquired_at": Field(opt_float, checks=(epoch_seconds,)),
    }

    run: str
    """Run name."""
    incident_id: str
    """The incident that holds the lock."""
    job_id: int | None
    """The Slurm job that incident acts on (None when its alert named none)."""
    acquired_at: float
    """Epoch seconds."""
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentJoin(Declared):
    """The note an incident leaves when its alert joined the incident that holds the run
    (`runs/<run>/incident-joins/<incident id>.json`): which one it joined, kept after the lock is gone."""

    KIND = "incident_join"
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "incident_id": Field(opt_str, checks=(non_empty,)),
        "alert_key": Field(opt_str, checks=(non_empty,)),
        "joined": Field(opt_str, checks=(non_empty,)),
    }

    run: str
    """Run name."""
    incident_id: str
    """The incident that joined."""
    alert_key: str
    """Its alert."""
    joined: str
    """The incident it joined (the holder of the run's lock)."""
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class Decision:
    """What an incident may do: act, join the holder, or wait for it."""

    action: Literal["act", "join", "wait"]
    holder: IncidentLock
    why: str = ""
    """Set when the holder's record does not read: what is wrong, its key, and the runbook."""


def lock_key(run: str) -> str:
    return schema.store_key(run, LOCK_PATH)


def join_key(run: str, incident_id: str) -> str:
    return schema.store_key(run, f"incident-joins/{incident_id}.json")


def read(store: ObjectStore, run: str) -> tuple[IncidentLock, str] | None:
    """The lock and its ETag, or None."""
    info = store.head(lock_key(run))
    if info is None:
        return None
    try:
        return IncidentLock.from_json(json.loads(store.get_bytes(lock_key(run)))), info.etag
    except NotFound:
        return None


def _expired(store: ObjectStore, lock: IncidentLock, now: float) -> tuple[bool, str]:
    """(whether the lock counts as free, why not when the holder's record does not read)."""
    if now - lock.acquired_at > LOCK_TTL_S:
        return True, ""
    try:
        rec = record.load_typed(store, run=lock.run, incident_id=lock.incident_id)
    except NotFound:
        return False, ""  # opened a moment ago, record not written yet
    except ValueError as e:  # not JSON, or not an incident record: its status is unknown, the lock held
        key = record.record_key(lock.run, lock.incident_id)
        why = (
            f"the record of incident {lock.incident_id}, which holds run {lock.run}'s lock, does not read"
            f" ({e}); the lock stays held until it reads or is {LOCK_TTL_S / 3600:.0f} h old. Fix or remove"
            f" {key}, or delete the lock {lock_key(lock.run)}. Runbook: {runbooks.RELAUNCH_FAILED}"
        )
        log.warning("%s", why)
        return False, why
    return rec.status in FINAL_STATUSES, ""


def enter(store: ObjectStore, *, run: str, incident_id: str, job_id: int | None) -> Decision:
    """Take the run's lock for `incident_id`, or say whom to join or wait for.

    The lock is created only if absent, and an expired one replaced only if it is still the version
    judged (training.store.update); a lost race re-reads the winner, three tries in all."""
    mine = IncidentLock(run=run, incident_id=incident_id, job_id=job_id, acquired_at=time.time())
    decision = Decision("act", mine)  # what the last run of `decide` said

    def decide(raw: Any) -> dict[str, Any] | None:
        nonlocal decision
        decision = Decision("act", mine)
        if raw is None:
            return mine.to_json()
        held = IncidentLock.from_json(raw)
        if held.incident_id == incident_id:
            decision = Decision("act", held)
            return None
        free, why = _expired(store, held, time.time())
        if free:
            return mine.to_json()
        same_job = held.job_id is not None and held.job_id == job_id and not why
        decision = Decision("join" if same_job else "wait", held, why)
        return None

    try:
        update_json(
            store, lock_key(run), decide, dump=dump_json, create=True, attempts=3, what="incident lock"
        )
    except UpdateConflict:
        raise RuntimeError(f"incident lock of run {run}: changed three times while reading it") from None
    return decision


def release(store: ObjectStore, *, run: str, incident_id: str) -> bool:
    """Drop the lock if `incident_id` holds it; True when it did."""
    found = read(store, run)
    if found is None or found[0].incident_id != incident_id:
        return False
    store.delete(lock_key(run))
    return True


def join(store: ObjectStore, holder: IncidentLock, *, incident_id: str, alert_key: str) -> dict[str, Any]:
    """Note on the holder's record that `alert_key` joined it (once); returns that record."""
    return join_incident(
        store, run=holder.run, holder_id=holder.incident_id, incident_id=incident_id, alert_key=alert_key
    )


def join_incident(
    store: ObjectStore, *, run: str, holder_id: str, incident_id: str, alert_key: str
) -> dict[str, Any]:
    """Note on incident `holder_id`'s record that `alert_key` (incident `incident_id`) joined it, once, and
    leave the join note `joined_to` reads; returns the holder's record (waited for, bounded, when the
    holder has not written it yet)."""

    def change(rec: dict[str, Any]) -> None:
        joined = rec.setdefault("joined", [])
        if not any(j.get("incident_id") == incident_id for j in joined):
            joined.append({"incident_id": incident_id, "alert_key": alert_key, "time": time.time()})

    note = IncidentJoin(run=run, incident_id=incident_id, alert_key=alert_key, joined=holder_id)
    put_json(store, join_key(run, incident_id), note.to_json())
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        try:
            return record.update(store, run=run, incident_id=holder_id, change=change)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)


def joined_to(store: ObjectStore, *, run: str, incident_id: str) -> str | None:
    """The incident `incident_id` joined, if it joined one (its join note, kept after the lock is gone).
    A note that does not read raises SchemaError (a ValueError) naming the field: whether the incident
    joined another is then unknown, and the caller must not act as if it held the run."""
    try:
        raw = store.get_bytes(join_key(run, incident_id))
    except NotFound:
        return None
    try:
        return IncidentJoin.from_json(json.loads(raw)).joined
    except ValueError as e:
        raise SchemaError(f"{join_key(run, incident_id)}: {e}") from e
