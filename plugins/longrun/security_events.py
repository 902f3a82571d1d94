"""Security events: evidence longrun refused to act on, and why.

Raised wherever something that crossed a trust boundary failed its check (an alert that is unsigned,
wrongly signed, about another run or job, or names a node outside the job's allocation; a job that does
not carry longrun's tag for the run; ...). Acting on it would have drained, cancelled or rolled back
something; instead nothing is done, this record is written on the orchestrator side of the store
(`runs/<run>/security-events/<at>-<id>.json`, which a job's identity cannot write) and the task log says
so at ERROR with the runbook. Runbook: runbooks/security-event.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.records import schema
from training.records.fields import need, opt_dict, opt_float, opt_str, stamped
from training.records.schema import SchemaError
from training.store.interface import ObjectStore, StoreError, put_json

log = logging.getLogger("longrun.security")

KIND = "security_event"
SCHEMA_VERSION = 1
RUNBOOK = "runbooks/security-event.md"
FOLDER = "security-events/"
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityEvent:
    """One refusal to act on evidence that did not check out."""

    run: str
    """The run the evidence claimed to be about (the DAG run's run name)."""
    reason: str
    """Short code: unsigned, bad_signature, other_run, other_job, node_outside_allocation, not_our_job,
    no_key, no_job, undeclared_conf, ..."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """What was seen (store key, job id, nodes; never a key or a secret)."""
    at: float = 0.0
    """Epoch seconds (now when 0)."""
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        try:
            schema.check_run_name(self.run)
        except SchemaError as e:
            raise SchemaError(f"{KIND} record field 'run': {e}") from None
        if not isinstance(self.reason, str) or not _REASON.match(self.reason):
            raise SchemaError(
                f"{KIND} record field 'reason' = {self.reason!r}: must be a short code ([a-z][a-z0-9_]*)"
            )
        if not isinstance(self.details, Mapping):
            raise SchemaError(f"{KIND} record field 'details' = {self.details!r:.80}: must be an object")
        if isinstance(self.at, bool) or not isinstance(self.at, int | float) or self.at < 0:
            raise SchemaError(f"{KIND} record field 'at' = {self.at!r}: must be epoch seconds")
        if self.kind != KIND:
            raise SchemaError(f"{KIND} record field 'kind' = {self.kind!r}; expected {KIND!r}")
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(
                f"{KIND} record field 'schema_version' = {self.schema_version!r}; this reader knows {SCHEMA_VERSION}"
            )
        object.__setattr__(self, "details", dict(self.details))
        if not self.at:
            object.__setattr__(self, "at", time.time())

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "details": dict(self.details), "runbook": RUNBOOK}

    @classmethod
    def from_json(cls, raw: Any) -> SecurityEvent:
        """The event in a stored record (JSON text or object); the `runbook` it carries is not a field."""
        obj = stamped(KIND, raw, SCHEMA_VERSION)
        return cls(
            run=need(KIND, obj, "run", opt_str),
            reason=need(KIND, obj, "reason", opt_str),
            details=opt_dict(KIND, obj, "details"),
            at=need(KIND, obj, "at", opt_float),
            kind=obj["kind"],
            schema_version=obj["schema_version"],
        )


def raise_event(
    store: ObjectStore | None, *, run: str, reason: str, details: Mapping[str, Any] | None = None
) -> SecurityEvent:
    """Record and log a security event. The record write is best effort (the log line is not): a store
    error must not turn a refusal into an action."""
    ev = SecurityEvent(run=run, reason=reason, details=details or {})
    log.error(
        "SECURITY EVENT run %s: %s %s; nothing was acted on (runbook: %s)",
        run,
        reason,
        json.dumps(ev.details, sort_keys=True, default=str)[:2000],
        RUNBOOK,
    )
    if store is not None:
        key = schema.store_key(run, f"{FOLDER}{ev.at:.3f}-{uuid.uuid4().hex[:8]}.json")
        try:
            put_json(store, key, ev.to_json(), if_none_match=True)
        except StoreError as e:
            log.error("security event not stored (%s): %s", key, e)
    return ev


def events(store: ObjectStore, run: str) -> list[SecurityEvent]:
    """The run's security events, oldest first (unreadable ones skipped)."""
    out = []
    for info in store.list(schema.store_key(run, FOLDER)):
        try:
            out.append(SecurityEvent.from_json(json.loads(store.get_bytes(info.key))))
        except (StoreError, ValueError):
            continue
    return sorted(out, key=lambda e: e.at)
