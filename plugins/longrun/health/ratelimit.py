"""Drain rate limit: a ledger of drains in the store, changed only by conditional writes.

Why: a software bug that looks like SDC (or a bad check) must not drain the cluster one node per alert.
Two rules, both enforced before any `scontrol update state=drain`:

- at most `max_drains` drains in any `window_s` (cluster-wide, every run counts);
- at most `max_nodes_per_incident` nodes per incident (1): a second node for the same incident needs an
  operator (`operator_override=True`, which the approve mode's human decision supplies).

The ledger is one JSON object (`LEDGER_KEY`); each reservation reads it with its ETag and writes it back
with If-Match (If-None-Match for the first), retrying when another writer won (training.store.update).
Reserving is idempotent: the same (incident, node) again returns the existing grant and counts once.

The ledger lives on the orchestrator side of the store (training.store.sides), which a job's identity can
neither write nor delete. An entry dated in the future (beyond `CLOCK_SKEW_S`) or unreadable counts for
nothing: otherwise whoever wrote it would block every real drain, or lift the limit with a time far in the
past. Such entries move to the ledger's `quarantined` list (kept as evidence) and each raises a security
event (runbooks/security-event.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from longrun import security_events
from training.records import schema
from training.records.fields import need, opt_float, opt_str
from training.records.schema import SchemaError
from training.store.interface import NotFound, ObjectStore, dump_json
from training.store.update import UpdateConflict, update_json

LEDGER_KEY = "ops/drain-ledger.json"
#: Airflow Variable holding the policy as JSON, e.g. {"max_drains": 2, "window_s": 3600}: a cluster
#: operator's setting, not a run parameter (whoever triggers a run must not lift the limit).
DRAIN_POLICY_VARIABLE = "longrun_drain_policy"
KEEP_S = 7 * 24 * 3600  # entries older than this are dropped from the ledger
MAX_ATTEMPTS = 8
#: Clocks of the Airflow workers may differ this much; a later entry is from the future.
CLOCK_SKEW_S = 300.0
QUARANTINE_KEEP = 100


class DrainRefused(Exception):
    """The rate limit forbids this drain; the message says which rule and what an operator can do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainPolicy:
    """How many drains longrun may do on its own."""

    max_drains: int = 2
    """Drains allowed in any window of `window_s` seconds, cluster-wide."""
    window_s: float = 3600.0
    """The sliding window, in seconds."""
    max_nodes_per_incident: int = 1
    """Nodes one incident may drain without an operator."""

    def __post_init__(self) -> None:
        if isinstance(self.max_drains, bool) or not isinstance(self.max_drains, int) or self.max_drains < 1:
            raise ValueError(f"max_drains={self.max_drains!r}: must be an integer >= 1")
        if not isinstance(self.window_s, int | float) or not self.window_s > 0:
            raise ValueError(f"window_s={self.window_s!r}: must be a number of seconds > 0")
        n = self.max_nodes_per_incident
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_nodes_per_incident={n!r}: must be an integer >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainGrant:
    """Permission to drain one node for one incident."""

    incident_id: str
    """The incident the drain belongs to."""
    node: str
    """The node."""
    time: float
    """When the grant was first written (epoch seconds)."""
    already: bool
    """True when this (incident, node) was granted before: the caller is a rerun."""
    in_window: int
    """Drains in the current window, this one included."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainEntry:
    """One drain in the ledger. Only what the count needs is checked: an entry whose `incident_id`,
    `node` or `time` is not of its type counts for nothing (it is quarantined); anything else it holds
    (`run`, `override`, ...) is kept as written."""

    KIND = "drain_ledger entry"
    incident_id: str
    node: str
    time: float
    """Epoch seconds, as written (an integer stays one)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{cls.KIND} must be a JSON object, got {type(obj).__name__}")
        t = need(cls.KIND, obj, "time", opt_float)  # a number as written, not true/false
        if t != t:
            raise SchemaError(f"{cls.KIND} field 'time' is NaN")
        return cls(
            incident_id=need(cls.KIND, obj, "incident_id", opt_str),
            node=need(cls.KIND, obj, "node", opt_str),
            time=t,
            extra={k: v for k, v in obj.items() if k not in ("incident_id", "node", "time")},
        )

    def to_json(self) -> dict[str, Any]:
        return {"incident_id": self.incident_id, "node": self.node, **self.extra, "time": self.time}


def _ledger(store: ObjectStore, data: Any) -> dict[str, Any]:
    """The stored ledger `data` (None: there is none yet, an empty one), or ValueError."""
    if data is None:
        return {"schema_version": 1, "kind": "drain_ledger", "entries": []}
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(
            f"{LEDGER_KEY} in {store.describe()} is not a drain ledger (an object whose field 'entries' is"
            " a list): fix or delete it"
        )
    return data


def _read(store: ObjectStore) -> tuple[dict[str, Any], str | None]:
    """(the ledger, its ETag; None when there is none yet), for readers."""
    info = store.head(LEDGER_KEY)
    if info is None:
        return _ledger(store, None), None
    try:
        data = json.loads(store.get_bytes(LEDGER_KEY))
    except NotFound:
        return _ledger(store, None), None
    return _ledger(store, data), info.etag


def _bad(e: Any, now: float) -> str | None:
    """Why the entry cannot count (None when it can)."""
    try:
        entry = DrainEntry.from_json(e)
    except SchemaError:
        return "ledger_bad_entry"
    if entry.time > now + CLOCK_SKEW_S:
        return "ledger_future_entry"
    return None


def _report(store: ObjectStore, bad: list[tuple[str, Any]], *, run: str, now: float) -> None:
    for reason, e in bad:
        who = e.get("run") if isinstance(e, dict) else None
        try:
            target = schema.check_run_name(who) if isinstance(who, str) else run
        except schema.SchemaError:
            target = run
        details = {"entry": e, "now": now, "ledger": LEDGER_KEY, "ignored": True}
        security_events.raise_event(store, run=target, reason=reason, details=details)


def entries(store: ObjectStore) -> list[dict[str, Any]]:
    """Every drain in the ledger, oldest first."""
    return list(_read(store)[0]["entries"])


def _quarantined_of(ledger: dict[str, Any]) -> list[Any]:
    moved = ledger.get("quarantined")
    return (
        [q["entry"] for q in moved if isinstance(q, dict) and "entry" in q] if isinstance(moved, list) else []
    )


def quarantined(store: ObjectStore) -> list[Any]:
    """The entries moved out of the count (as written; see `_bad`), oldest first."""
    return _quarantined_of(_read(store)[0])


def entries_and_quarantined(store: ObjectStore) -> list[Any]:
    """`entries`, then `quarantined`, from one read of the ledger (one version of it)."""
    ledger = _read(store)[0]
    return [*ledger["entries"], *_quarantined_of(ledger)]


def reserve_drain(
    store: ObjectStore,
    *,
    incident_id: str,
    node: str,
    run: str,
    policy: DrainPolicy | None = None,
    operator_override: bool = False,
    now: float | None = None,
) -> DrainGrant:
    """Record a drain of `node` for `incident_id`, or raise DrainRefused. Safe against concurrent callers.

    Bad entries leave the count first, in a write of their own (kept whatever this call then decides,
    and reported after it), and the ledger is read again; then the grant is decided and written. Both
    writes are conditional on the version read; MAX_ATTEMPTS tries in all.

    Why one function: the conditional write's `change` is a closure that leaves what it decided (the
    quarantined entries, the grant) for the code after the write; both halves read the same state."""
    policy = policy or DrainPolicy()
    tries = 0
    # What the last run of `change` decided (the run whose write went through, or that wrote nothing).
    at = 0.0
    bad: list[tuple[str, Any]] = []  # entries it quarantined
    grant: DrainGrant | None = None

    def change(raw: Any) -> dict[str, Any] | None:
        nonlocal tries, at, bad, grant
        tries += 1
        at = t = time.time() if now is None else now
        ledger = _ledger(store, raw)
        bad, grant = [(why, e) for e in ledger["entries"] if (why := _bad(e, t))], None
        if bad:
            # Out of the count first, whatever this call decides; reported once, after the write.
            seen = list(ledger.get("quarantined") or [])
            moved = [{"reason": w, "entry": e, "at": t} for w, e in bad]
            ledger["entries"] = [e for e in ledger["entries"] if not _bad(e, t)]
            ledger["quarantined"] = [*seen, *moved][-QUARANTINE_KEEP:]
            return ledger
        grant, entries = _decide(
            [DrainEntry.from_json(e) for e in ledger["entries"]],  # every bad one went above
            incident_id=incident_id,
            node=node,
            run=run,
            policy=policy,
            operator_override=operator_override,
            t=t,
        )
        if entries is None:
            return None
        ledger["entries"] = entries
        return ledger

    while tries < MAX_ATTEMPTS:
        try:
            update_json(
                store,
                LEDGER_KEY,
                change,
                dump=dump_json,
                create=True,
                attempts=MAX_ATTEMPTS - tries,
                what="drain ledger",
            )
        except UpdateConflict:
            break
        if bad:
            _report(store, bad, run=run, now=at)
            continue  # read the cleaned ledger again and decide on it
        assert grant is not None  # the last run of `change` found nothing bad, so it decided
        return grant
    raise DrainRefused(f"drain ledger {LEDGER_KEY} kept changing under us ({MAX_ATTEMPTS} attempts); retry")


def _decide(
    parsed: list[DrainEntry],
    *,
    incident_id: str,
    node: str,
    run: str,
    policy: DrainPolicy,
    operator_override: bool,
    t: float,
) -> tuple[DrainGrant, list[dict[str, Any]] | None]:
    """(the grant, the ledger's new entries) on the entries `parsed` at time `t`, or DrainRefused. The
    entries are None when the grant is `already` there: nothing to write."""
    kept = [e for e in parsed if t - e.time < KEEP_S]
    for e in kept:
        if e.incident_id == incident_id and e.node == node:
            in_window = sum(1 for x in kept if t - x.time < policy.window_s)
            grant = DrainGrant(
                incident_id=incident_id, node=node, time=float(e.time), already=True, in_window=in_window
            )
            return grant, None
    mine = sorted({e.node for e in kept if e.incident_id == incident_id})
    if len(mine) >= policy.max_nodes_per_incident and not operator_override:
        raise DrainRefused(
            f"incident {incident_id} already drained {mine}; draining {node} too needs an operator "
            f"(at most {policy.max_nodes_per_incident} node(s) per incident): approve it by hand"
        )
    window = [e for e in kept if t - e.time < policy.window_s]
    if len(window) >= policy.max_drains and not operator_override:
        raise DrainRefused(
            f"drain rate limit: {len(window)} drains in the last {policy.window_s:.0f} s "
            f"(limit {policy.max_drains}): {[e.node for e in window]}; not draining {node} for "
            f"{incident_id}. Many drains at once suggest software, not hardware: see the runbook"
        )
    entry = DrainEntry(
        incident_id=incident_id, node=node, time=t, extra={"run": run, "override": operator_override}
    )
    grant = DrainGrant(incident_id=incident_id, node=node, time=t, already=False, in_window=len(window) + 1)
    return grant, [e.to_json() for e in (*kept, entry)][-1000:]


def release_drain(store: ObjectStore, *, incident_id: str, node: str) -> bool:
    """Take back the grant of (incident, node) when the drain did not happen (someone else drained the
    node first): a drain that longrun did not do uses no slot. True when an entry was removed."""

    def change(raw: Any) -> dict[str, Any] | None:
        if raw is None:
            return None
        ledger = _ledger(store, raw)
        kept = [
            e
            for e in ledger["entries"]
            if not (e.get("incident_id") == incident_id and e.get("node") == node)
        ]
        if len(kept) == len(ledger["entries"]):
            return None
        ledger["entries"] = kept
        return ledger

    try:
        return update_json(
            store, LEDGER_KEY, change, dump=dump_json, create=True, attempts=MAX_ATTEMPTS, what="drain ledger"
        ).written
    except UpdateConflict:
        raise DrainRefused(
            f"drain ledger {LEDGER_KEY} kept changing under us ({MAX_ATTEMPTS} attempts); retry"
        ) from None
