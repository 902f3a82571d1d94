"""How every step of `sdc_incident` runs: load the record, skip what is done, observe, act, record.

A step (steps.py, step_drain.py, step_diagnose.py, step_relaunch.py) keeps only its action; this module
owns the sequence around it:

    load      the incident record, once, as the typed record (training.records.Incident; the timeline is
              the memory of every earlier try); `done`, `observe` and `act` are handed that object
    done      what an earlier try recorded -> return it again, touch neither Slurm nor the store
    observe   observe mode: record the "would_..." event instead of acting (steps whose would-be action
              depends on what they find, like freeze, return their would_ outcome from the action)
    act       the step's action -> an Outcome: the event, the record fields it sets, the status, the
              runbook, what the task returns, and whether the incident must stop (IncidentStop)
    record    one conditional write of the Outcome; the event goes on the timeline at most once

Also here: the Incident (who it is about, built once from the DAG run's params), IncidentStop, and
`authenticate`, the gate every destructive action passes first. No Airflow here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from longrun import alert_auth, security_events
from longrun.incident import modes, record
from longrun.incident.events import Event
from longrun.slurm.client import SlurmClient
from training.records import schema
from training.records.alert import Alert
from training.records.orchestrator import Incident as IncidentRecord
from training.records.orchestrator import IncidentStatus
from training.store.interface import NotFound, ObjectStore

Rec = IncidentRecord
"""An incident record as a step reads it: the typed record (training.records.Incident), loaded once per
step by `run`. What is written goes through `write` (the stored JSON is changed, never rebuilt)."""


class IncidentStop(Exception):
    """The incident must stop here and a person must look (ambiguous evidence, rate limit, no nodes).
    The message names the runbook."""


class IncidentSkip(Exception):
    """This step has nothing to do because a step it needs did not happen (a person rejected the drain):
    the task is skipped, the record is left as it is. The message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """Who the incident is about; built once from the DAG run's params."""

    run: str
    """Run name."""
    alert_key: str
    """Store key of the alert record."""
    alert: Mapping[str, Any]
    """The alert record."""
    job_id: int | None
    """The Slurm job that raised it (None if unknown)."""
    run_params: Mapping[str, Any]
    """The training_run params of the attempt that raised it (a RunSpec's params)."""
    dag_run_id: str = "manual"
    """The sdc_incident DAG run (part of the relaunch job's tag)."""
    alert_seen_at: float | None = None
    """When the monitor's trigger saw the alert (epoch s): the sensor latency is this minus the alert's time."""

    def __post_init__(self) -> None:
        schema.check_run_name(self.run)
        Alert.from_json(self.alert)  # the alert reads as the typed record, or nothing starts

    @property
    def typed_alert(self) -> Alert:
        """The alert as the typed record (`alert` is the JSON object as written)."""
        return Alert.from_json(self.alert)

    @property
    def incident_id(self) -> str:
        return schema.incident_id_for(self.alert_key)

    @property
    def step(self) -> int:
        return int(self.alert["step"])

    @property
    def mode(self) -> str:
        return str(self.run_params.get("incident_mode", modes.ACT))

    @property
    def plan(self) -> modes.ModePlan:
        return modes.plan(self.mode)

    def rec(self, store: ObjectStore) -> IncidentRecord:
        """The incident record as it is now, typed."""
        return record.load_typed(store, run=self.run, incident_id=self.incident_id)

    def event(
        self, store: ObjectStore, name: Event, fields: Mapping[str, Any] | None = None, **data: Any
    ) -> dict[str, Any]:
        """Append event `name` now, in the middle of an action (e.g. `relaunch_submitted` before the wait
        for RUNNING, so a try that dies there leaves the trace)."""
        return record.add_event(
            store, run=self.run, incident_id=self.incident_id, name=name, fields=fields, **data
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one step did, as the record and the task see it."""

    result: Mapping[str, Any] = field(default_factory=dict)
    """What the task returns (XCom, the task log)."""
    event: Event | None = None
    """The timeline event; None when the action recorded its own (e.g. the in-job path)."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """The event's details on the timeline (node, state, verdict, ...)."""
    at: float | None = None
    """The event's time (epoch s); None: now."""
    fields: Mapping[str, Any] = field(default_factory=dict)
    """Record fields the step sets (drain, diagnosis, checkpoint, relaunch, ...)."""
    status: IncidentStatus | None = None
    """The incident's new status; None leaves it."""
    runbook: str | None = None
    """A runbook to link from the record."""
    stop: str | None = None
    """Stop the incident after recording: the IncidentStop message (names the runbook)."""

    def writes(self) -> bool:
        return (
            self.event is not None or bool(self.fields) or self.status is not None or self.runbook is not None
        )


def write(store: ObjectStore, inc: Incident, out: Outcome) -> dict[str, Any]:
    """Record `out` with one conditional write (safe to repeat: the event is added once)."""

    def change(rec: dict[str, Any]) -> None:  # the stored JSON: written back as read, plus this change
        record.apply_event(rec, out.event, fields=out.fields, data=out.data, at=out.at)
        if out.status is not None:
            rec["status"] = out.status
        if out.runbook is not None:
            record.add_runbook(rec, out.runbook)

    return record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)


def finish(store: ObjectStore, inc: Incident, out: Outcome) -> dict[str, Any]:
    """Record `out`, then stop the incident if it says so, else return the task's result."""
    if out.writes():
        write(store, inc, out)
    if out.stop is not None:
        raise IncidentStop(out.stop)
    return dict(out.result)


def stop(store: ObjectStore, inc: Incident, out: Outcome) -> NoReturn:
    """Record `out` and stop the incident (`out.stop` is the message)."""
    finish(store, inc, out)
    raise IncidentStop(out.stop or f"incident {inc.incident_id} stopped")


def run(
    store: ObjectStore,
    inc: Incident,
    *,
    act: Callable[[Rec], Outcome],
    done: Callable[[Rec], dict[str, Any] | None] | None = None,
    observe: Callable[[Rec], Outcome] | None = None,
) -> dict[str, Any]:
    """Run one step: load the typed record once; `done(rec)` not None -> return it (an earlier try did the work);
    observe mode and an `observe` -> record its outcome; else record `act`'s. The step's own pre-work
    (e.g. restoring a drain before the diagnosis) happens before this call."""
    rec = inc.rec(store)
    if done is not None and (prior := done(rec)) is not None:
        return prior
    if observe is not None and not inc.plan.changes:
        return finish(store, inc, observe(rec))
    return finish(store, inc, act(rec))


def _known_allocation(store: ObjectStore, inc: Incident) -> tuple[str, ...]:
    """The job's nodes recorded when the incident opened on a checked alert (`authenticated`), if any."""
    try:
        rec = inc.rec(store)
    except NotFound:
        return ()  # the open step's own check: nothing recorded yet
    seen = rec.event(Event.AUTHENTICATED)
    nodes = seen.details.get("allocation") if seen is not None else None
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        return ()
    return tuple(nodes)


def authenticate(
    store: ObjectStore, client: SlurmClient, inc: Incident, *, node: str | None = None
) -> alert_auth.Verdict:
    """The gate in front of every action: the alert is signed with its job's key, is about this run and
    this job, the job is longrun's for the run, and its suspect nodes (and `node`) are in Slurm's
    allocation of the job. Otherwise: a security event, and IncidentStop (nothing acted on)."""
    verdict = alert_auth.verify_alert(
        store,
        client,
        run=inc.run,
        job_id=inc.job_id,
        alert=inc.alert,
        known_allocation=_known_allocation(store, inc),
    )
    if verdict.ok and node is not None and node not in verdict.allocation:
        verdict = alert_auth.Verdict(False, "node_outside_allocation", {**verdict.details, "node": node})
    if not verdict.ok:
        details = {**verdict.details, "alert_key": inc.alert_key, "dag_run_id": inc.dag_run_id}
        security_events.raise_event(store, run=inc.run, reason=verdict.reason, details=details)
        raise IncidentStop(
            f"alert {inc.alert_key} not acted on ({verdict.reason}): nothing drained, cancelled or rolled"
            f" back. Runbook: {security_events.RUNBOOK}"
        )
    return verdict
