"""Node history: one record per event about a node, across runs and incidents.

    nodes/<node>/<time_ms>-<kind>-<source>.json      one NodeEvent

An event is written once (If-None-Match): its key carries the source (the incident, or the node_return
DAG run) and kind, so a retried task that writes the same event again is a no-op, and `events()` reads
the whole story in time order. This is orchestrator state: `history_store()` is the one place that says
which store holds it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun.health.diagnose import VERDICTS
from longrun.slurm import validate as v
from training.records.base import FIELDS_HERE, Declared
from training.records.diagnosis import Diagnosis
from training.records.fields import (
    Field,
    epoch_seconds,
    matches,
    one_of,
    opt_dict,
    opt_float,
    opt_str,
    versioned,
)
from training.records.schema import SchemaError
from training.store.factory import store_from_env
from training.store.interface import NotFound, ObjectStore, StoreError
from training.store.update import create_once

RECORD_KIND = "node_event"  # the registry's name (training.records.KINDS); not stored: `kind` is the event
SCHEMA_VERSION = 1
PREFIX = "nodes/"

SUSPECTED = "suspected"  # an alert named the node (attribution)
DRAINED = "drained"  # longrun drained it
DIAGNOSED = "diagnosed"  # a diagnostic ran: verdict pass / fail / error / unconfirmed, with its evidence
RETURNED = "returned"  # node_return resumed it after clean repeated diagnostics
RETURN_REFUSED = "return_refused"  # node_return would not return it (policy, foreign drain, dirty probe)
WOULD_RETURN = "would_return"  # observe mode: clean, but nothing changed
REPLACE = "marked_for_replacement"  # a repeat offender: never returned automatically
KINDS = (SUSPECTED, DRAINED, DIAGNOSED, RETURNED, RETURN_REFUSED, WOULD_RETURN, REPLACE)

_SOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def history_store() -> ObjectStore:
    """The store that holds node history (orchestrator state)."""
    return store_from_env()


def source_id(text: str) -> str:
    """A key-safe form of a source (an incident id, or `node_return.<dag run id>`)."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:128].lstrip("._-")
    return s or "unknown"


def _slurm_node(name: Any) -> str | None:
    try:
        v.node("node", name)
    except ValueError as e:
        return str(e)
    return None


def _a_string(value: Any) -> str | None:
    return None if isinstance(value, str) else "expected a string or null"


_OPT_STR = Field(opt_str, need=False, checks=(_a_string,))


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent(Declared):
    """One thing that happened to a node. Its `kind` is the event, not a stamp; a field this class does
    not know is refused (the record is written whole, once)."""

    KIND = RECORD_KIND
    VERSION = SCHEMA_VERSION
    FIELDS = {
        "node": Field(opt_str, checks=(_slurm_node,)),
        "kind": Field(opt_str, checks=(one_of(KINDS),)),
        "time": Field(opt_float, checks=(epoch_seconds, lambda t: None if t > 0 else "must be > 0")),
        "source": Field(opt_str, checks=(matches(_SOURCE, "expected 1-128 of [A-Za-z0-9._-]"),)),
        "run": _OPT_STR,
        "incident_id": _OPT_STR,
        "verdict": Field(opt_str, need=False, checks=(_a_string, one_of(VERDICTS))),
        "reason": _OPT_STR,
        "evidence": Field(opt_dict, need=False),
    }
    ORDER = ("schema_version", FIELDS_HERE)

    node: str
    """Slurm node name."""
    kind: str
    """One of KINDS."""
    time: float
    """When (epoch seconds)."""
    source: str
    """Who recorded it: an incident id, or `node_return.<dag run id>`; part of the key."""
    run: str | None = None
    """The training run involved, if any."""
    incident_id: str | None = None
    """The incident involved, if any."""
    verdict: str | None = None
    """pass / fail / error / unconfirmed (diagnose.VERDICTS) for `diagnosed`; None otherwise."""
    reason: str | None = None
    """The drain reason on the node, or why (refusals, replacement)."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """Check, step, fingerprints, probe results: what the event rests on."""
    schema_version: int = SCHEMA_VERSION
    """Version of this record's layout."""

    def _settle(self) -> None:
        if not isinstance(self.evidence, Mapping):  # None too: always written as an object
            raise SchemaError(
                f"{self.KIND} record field 'evidence' = {self.evidence!r:.80}: must be an object"
            )

    @classmethod
    def _open(cls, raw: Any) -> Mapping[str, Any]:
        obj = versioned(cls.KIND, raw, cls.VERSION)
        if unknown := sorted(set(obj) - {*cls.FIELDS, "schema_version"}):
            raise SchemaError(f"{cls.KIND} record has unknown field(s) {unknown}")
        return obj

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.node}/{int(self.time * 1000):013d}-{self.kind}-{self.source}.json"


def _existing(store: ObjectStore, ev: NodeEvent) -> NodeEvent | None:
    """The event of the same kind from the same source, if one was written before (any time)."""
    tail = f"-{ev.kind}-{ev.source}.json"
    for info in store.list(f"{PREFIX}{ev.node}/"):
        if info.key.endswith(tail):
            return NodeEvent.from_json(json.loads(store.get_bytes(info.key)))
    return None


def append(store: ObjectStore, ev: NodeEvent) -> NodeEvent:
    """Write `ev` unless the same source already recorded this kind for the node; the stored event."""
    if (old := _existing(store, ev)) is not None:
        return old
    # once: else a concurrent try wrote the same key
    create_once(store, ev.key, json.dumps(ev.to_json(), sort_keys=True).encode())
    return ev


def record(store: ObjectStore, node: str, kind: str, source: str, **fields: Any) -> NodeEvent:
    """Build and append one event, timed now."""
    return append(
        store, NodeEvent(node=node, kind=kind, time=time.time(), source=source_id(source), **fields)
    )


def events(store: ObjectStore, node: str) -> list[NodeEvent]:
    """The node's events, oldest first. A record that does not parse raises ValueError naming its key."""
    v.node("node", node)
    out = []
    for info in store.list(f"{PREFIX}{node}/"):
        try:
            out.append(NodeEvent.from_json(json.loads(store.get_bytes(info.key))))
        except NotFound:
            continue
        except ValueError as e:
            raise ValueError(f"{info.key}: {e}") from None
    return sorted(out, key=lambda e: (e.time, e.key))


def nodes(store: ObjectStore) -> list[str]:
    """Every node with a history."""
    names = set()
    for info in store.list(PREFIX):
        parts = info.key[len(PREFIX) :].split("/")
        if len(parts) == 2:
            names.add(parts[0])
    return sorted(names)


def state(evs: list[NodeEvent]) -> str:
    """One word for where the node stands according to its history (Slurm has the live state). A mark
    for replacement sticks until a later return (which only a person can make happen then)."""
    for e in reversed(evs):
        if e.kind == RETURNED:
            break
        if e.kind == REPLACE:
            return "replace"
    for e in reversed(evs):
        if e.kind == REPLACE:
            return "replace"
        if e.kind == RETURNED:
            return "returned"
        if e.kind == DIAGNOSED:
            return f"diag-{e.verdict}"
        if e.kind in (DRAINED, SUSPECTED):
            return e.kind
    return "unknown"


def safe_events(store: ObjectStore, node: str) -> tuple[list[NodeEvent], str | None]:
    """events(), or ([], why) when the store cannot be read (for pages and logs, never for decisions)."""
    try:
        return events(store, node), None
    except (StoreError, ValueError) as e:
        return [], str(e)


def probe_evidence(diagnosis: Diagnosis | Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a diagnosis (a `Diagnosis`, or its JSON) worth keeping in the node's history."""
    diag = diagnosis if isinstance(diagnosis, Diagnosis) else Diagnosis.from_json(diagnosis)
    checked = diag.checked
    res = checked.probe_result
    return {
        "summary": diag.summary,
        "probe_verdict": checked.probe.verdict if checked.probe else None,
        "fingerprint": res.fingerprint,
        "expected": res.expected_fingerprint,
        "probe_env": {"torch": res.torch, "cpu_capability": res.cpu_capability, "threads": res.threads},
        "dcgm": checked.dcgm,
        "dcgm_level": diag.dcgm_level,
        "exit_code": diag.exit_code,
    }
