"""The records the orchestrator writes (its side of the store): validation, promotion, pick, suspect mark,
incident with its timeline and status. Field meanings are in docs/contracts.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Self

from training.records.alert import AlertRef
from training.records.base import Record
from training.records.diagnosis import Diagnosis, ProbeResult
from training.records.fields import opt_bool, opt_float, opt_int, opt_ints, opt_str, schema_fields, strs_of
from training.records.incident import Attribution, Closing, Drain, Recovery, Relaunch, RestartCheckpoint
from training.records.schema import SchemaError


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation(Record):
    """One validation attempt of a stored checkpoint."""

    KIND = "validation"
    run: str
    step: int
    ok: bool
    errors: tuple[str, ...]
    time: float
    manifest_key: str | None = None
    manifest_etag: str | None = None
    """The ETag of the manifest this validation read (promotion requires it to be the current one)."""
    FIELDS = schema_fields(
        KIND,
        errors=lambda kind, obj, name: tuple(str(e) for e in obj[name]),
        manifest_key=opt_str,
        manifest_etag=opt_str,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Promotion(Record):
    """A promotion: the pointer `promoted/current.json` and each entry of its history."""

    KIND = "promotion"
    run: str
    step: int
    manifest_key: str
    time: float
    seq: int
    previous_step: int | None = None
    by: str | None = None
    """Who promoted (`longrun`, a monitor's `training_run.monitor:<run id>`, `mark_suspect`)."""
    steps_indexed: bool | None = None
    """On the pointer: every step this run ever promoted has its `promoted/steps/<step>.json` (written
    since the run's first promotion, or backfilled once from the history), so readers list that folder
    instead of reading the history. Absent on a pointer older than the index: read the history."""
    FIELDS = schema_fields(KIND, previous_step=opt_int, by=opt_str, steps_indexed=opt_bool)


def _steps_by_check(kind: str, obj: Mapping[str, Any], field: str) -> dict[str, int | None] | None:
    """An optional object of steps by check name, each an integer or null (absent or null: None)."""
    v = obj.get(field)
    if v is None:
        return None
    if not isinstance(v, Mapping) or not all(
        s is None or (isinstance(s, int) and not isinstance(s, bool)) for s in v.values()
    ):
        raise SchemaError(
            f"{kind} record field {field!r} = {v!r:.80} is not an object of steps by check (integers or null)"
        )
    return dict(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pick(Record):
    """A pre-incident checkpoint choice and why (`step` None: nothing provably from before the fault)."""

    KIND = "pick"
    run: str
    alert: Mapping[str, Any]
    step: int | None
    why: str
    time: float
    bound: int | None = None
    """The last step every check able to see this fault had passed on every rank."""
    last_known_good: Mapping[str, int | None] | None = None
    """Per check able to see this fault, its last known-good step (`{check: step}`, as
    `pick_pre_incident` writes it): the newest step before the alert at which it passed on every rank,
    null when it never did. `bound` is the smallest of them (null when one is)."""
    key: str | None = None
    """Store key prefix of the chosen checkpoint."""
    FIELDS = schema_fields(KIND, bound=opt_int, last_known_good=_steps_by_check, key=opt_str)


@dataclass(frozen=True, slots=True, kw_only=True)
class SuspectMark(Record):
    """A demotion: checkpoints after `after_step` saved before this mark are suspect."""

    KIND = "suspect"
    run: str
    after_step: int
    reason: str
    time: float
    steps: tuple[int, ...] | None = None
    """An explicit list of suspect steps; when present it wins over `after_step`."""
    incident_id: str | None = None
    FIELDS = schema_fields(KIND, steps=opt_ints, incident_id=opt_str)

    def demotes(self, step: int, saved_at: float | None) -> bool:
        """The suspect rule. A mark demotes the checkpoints after its last known-good step that were
        saved BEFORE the mark: the relaunch after an incident saves later steps again from a clean
        checkpoint, and those are not suspect. `saved_at` None: by step alone."""
        if self.steps is not None:
            return step in self.steps
        return step > self.after_step and (saved_at is None or saved_at <= self.time)


class IncidentStatus(StrEnum):
    """Where an incident stands, in the order an incident moves through them."""

    OPEN = "open"
    AMBIGUOUS = "ambiguous"
    """Suspect software: nothing drained."""
    OBSERVED = "observed"
    """Observe mode: recorded what would be done."""
    REJECTED = "rejected"
    """Approve mode: an operator said no."""
    RELAUNCHED = "relaunched"
    FAILED = "failed"
    CLOSED = "closed"
    """Relaunched and healthy for N steps, or closed by an operator with a reason (incident/closing.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineEvent:
    """One named event of an incident (`opened`, `drained`, ...), at most once per incident."""

    event: str
    time: float | None
    details: Mapping[str, Any] = field(default_factory=dict)
    """The event's other fields (job id, node, verdict, ...)."""

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if isinstance(obj, str):  # the oldest records named events without a time
            return cls(event=obj, time=None)
        if not isinstance(obj, Mapping) or not isinstance(obj.get("event"), str):
            raise SchemaError(f"incident record field 'timeline' has an entry {obj!r:.80} without an event")
        return cls(
            event=obj["event"],
            time=opt_float("incident", obj, "time"),
            details={k: v for k, v in obj.items() if k not in ("event", "time")},
        )

    @classmethod
    def shown(cls, obj: Any) -> Self:
        """For a reader that must not fail (the UI): `from_json`, or, for an entry that does not read, an
        event named '' whose details are the entry's fields (its time too, when that is not a number)."""
        try:
            return cls.from_json(obj)
        except SchemaError:
            fields = dict(obj) if isinstance(obj, Mapping) else {"entry": obj}
            t = fields.pop("time", None)
            if t is not None and (not isinstance(t, int | float) or isinstance(t, bool)):
                fields["time"], t = t, None
            event = fields.pop("event", "")
            if not isinstance(event, str):
                fields["event"], event = event, ""
            return cls(event=event, time=t, details=fields)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event}
        if self.time is not None:
            out["time"] = self.time
        return {**out, **self.details}


def _status(kind: str, obj: Mapping[str, Any], name: str) -> IncidentStatus | str | None:
    """An `IncidentStatus`; a status this reader does not know (a newer writer's) stays a string: shown,
    not hidden."""
    status = opt_str(kind, obj, name)
    return IncidentStatus(status) if status in {s.value for s in IncidentStatus} else status


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident(Record):
    """One incident, keyed by its alert; the timeline says what was done."""

    KIND = "incident"
    run: str
    incident_id: str
    alert: Mapping[str, Any]
    timeline: tuple[TimelineEvent, ...]
    mode: str
    """`act`, `approve` or `observe`."""
    status: IncidentStatus | str | None = None
    """An `IncidentStatus`; a value this reader does not know stays the string the record holds."""
    alert_key: str | None = None
    attribution: Attribution = field(default_factory=Attribution)
    """Where the evidence points (empty: not attributed yet)."""
    drain: Drain = field(default_factory=Drain)
    """What the drain step did (empty: nothing drained)."""
    diagnosis: Diagnosis = field(default_factory=Diagnosis)
    """What the diagnose step found (empty: not diagnosed)."""
    checkpoint: RestartCheckpoint = field(default_factory=RestartCheckpoint)
    """The restart checkpoint: `step`, `key`, `why` (empty: not picked yet)."""
    relaunch: Relaunch = field(default_factory=Relaunch)
    """The job that runs again (empty: not relaunched)."""
    lost_steps: int | None = None
    time_to_recover_s: float | None = None
    runbooks: tuple[str, ...] = ()
    reference: ProbeResult = field(default_factory=ProbeResult)
    """The known-good probe result the diagnosis compares with (event `reference`; empty: none yet)."""
    recovery: Recovery = field(default_factory=Recovery)
    """The measured recovery (event `first_healthy_step`; empty: not measured yet)."""
    closed: Closing = field(default_factory=Closing)
    """How the incident closed (status `closed`; empty: not closed)."""

    # Written after the other fields (each by a later step), as they were when they were extra fields.
    FIELDS = schema_fields(
        KIND,
        timeline=lambda kind, obj, name: tuple(TimelineEvent.from_json(e) for e in obj[name]),
        status=_status,
        alert_key=opt_str,
        attribution=Attribution.read_or_empty,
        drain=Drain.read_or_empty,
        diagnosis=Diagnosis.read_or_empty,
        checkpoint=RestartCheckpoint.read_or_empty,
        relaunch=Relaunch.read_or_empty,
        lost_steps=opt_int,
        time_to_recover_s=opt_float,
        runbooks=strs_of,
        reference=ProbeResult.read_or_empty,
        recovery=Recovery.read_or_empty,
        closed=Closing.read_or_empty,
    )

    def event(self, name: str) -> TimelineEvent | None:
        """The timeline's event `name`, or None when it has not happened."""
        return next((e for e in self.timeline if e.event == name), None)

    @property
    def alert_ref(self) -> AlertRef:
        """The step, check and suspect nodes of this incident's copy of its alert, read tolerantly (the copy
        is free-form: a partial or older alert still shows)."""
        return AlertRef.from_json(self.alert)

    @property
    def old_verdict(self) -> str | None:
        """The diagnosis verdict as the oldest records kept it (a top-level `verdict`, before the
        `diagnosis` part), when it is a string."""
        v = self.extra.get("verdict")
        return v if isinstance(v, str) else None

    @property
    def old_runbook(self) -> str | None:
        """The runbook path as the oldest records kept it (a top-level `runbook`, before `runbooks`), when
        it is a string."""
        v = self.extra.get("runbook")
        return v if isinstance(v, str) else None

    @property
    def opened_at(self) -> float:
        """The earliest time on the timeline (0.0 when none has one)."""
        times = [e.time for e in self.timeline if e.time is not None]
        return min(times) if times else 0.0
