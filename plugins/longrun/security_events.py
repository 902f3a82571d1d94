"""Security events: evidence longrun refused to act on, and why.

Raised wherever something that crossed a trust boundary failed its check (an alert that is unsigned,
wrongly signed, about another run or job, or names a node outside the job's allocation; a job that does
not carry longrun's tag for the run; ...). Acting on it would have drained, cancelled or rolled back
something; instead nothing is done, this record is written on the orchestrator side of the store
(`runs/<run>/security-events/<at>-<id>.json`, which a job's identity cannot write) and the task log says
so at ERROR with the runbook. Runbook: runbooks/security-event.md.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.records import schema
from training.records.base import FIELDS_HERE, Declared
from training.records.fields import (
    Field,
    an_object,
    epoch_seconds,
    matches,
    not_negative,
    opt_dict,
    opt_float,
    opt_str,
    run_name,
)
from training.store.interface import ObjectStore, StoreError, put_json

log = logging.getLogger("longrun.security")

KIND = "security_event"
SCHEMA_VERSION = 1
RUNBOOK = "runbooks/security-event.md"
FOLDER = "security-events/"
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityEvent(Declared):
    """One refusal to act on evidence that did not check out. Its record names the runbook, which is
    not a field (`CONSTANT`)."""

    KIND = KIND
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "reason": Field(opt_str, checks=(matches(_REASON, "must be a short code ([a-z][a-z0-9_]*)"),)),
        "details": Field(opt_dict, need=False, checks=(an_object,)),
        "at": Field(opt_float, checks=(epoch_seconds, not_negative)),
    }
    ORDER = (FIELDS_HERE, "kind", "schema_version")
    CONSTANT = {"runbook": RUNBOOK}

    run: str
    """The run the evidence claimed to be about (the DAG run's run name)."""
    reason: str
    """Short code: unsigned, bad_signature, other_run, other_job, node_outside_allocation, not_our_job,
    no_key, no_job, undeclared_conf, ..."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """What was seen (store key, job id, nodes; never a key or a secret)."""
    at: float = 0.0
    """Epoch seconds (now when 0)."""
    schema_version: int = SCHEMA_VERSION

    def _settle(self) -> None:
        object.__setattr__(self, "details", dict(self.details))
        if not self.at:
            object.__setattr__(self, "at", time.time())


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
