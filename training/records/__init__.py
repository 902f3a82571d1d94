"""Typed records: one frozen dataclass per record kind, each with `from_json` (validates, raises a
ValueError naming the field) and `to_json`. Pure Python: no torch, no Airflow, no boto3.

    alert = Alert.from_json(json.loads(body))       # attributes, not .get() chains
    alert.world.world_size, alert.suspect_nodes

`parse(kind, obj)` builds the record of a kind named at run time; `loads(kind, data)` decodes JSON bytes
first. The key layout is in `training.records.schema`; the read model of a whole run is `longrun.runview`.

`KINDS` names every record kind the store holds. Every kind is a `Declared` (each field declared once,
`fields.Field`; the kinds of `training.records.schema`'s table through its base `Record`); the newer kinds
are registered here by where they live: several belong to the orchestrator (package `longrun`, which the
job must not import), so `KINDS` imports a newer kind's class on first use.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from training.records.alert import Alert
from training.records.base import Record, RecordType
from training.records.job import CheckRecord, Manifest, Progress, Report, Save
from training.records.orchestrator import (
    Incident,
    Pick,
    Promotion,
    SuspectMark,
    Validation,
)
from training.records.schema import SchemaError

#: The kinds of `training.records.schema`'s table: kind -> its record class.
SCHEMA_KINDS: dict[str, type[Record]] = {
    cls.KIND: cls
    for cls in (
        Alert,
        CheckRecord,
        Progress,
        Manifest,
        Save,
        Report,
        Validation,
        Promotion,
        Pick,
        SuspectMark,
        Incident,
    )
}

#: The newer kinds, each its own dataclass: kind -> "module:class".
_NEWER_KINDS: dict[str, str] = {
    "segment": "training.segment:Segment",
    "fault": "training.segment:FaultFired",
    "directive": "training.spares.directive:Directive",
    "node_event": "longrun.health.history:NodeEvent",
    "run_claim": "longrun.runclaim:RunClaim",
    "security_event": "longrun.security_events:SecurityEvent",
    "alert_key": "longrun.alert_auth:AlertKey",
    "incident_lock": "longrun.incident.exclusive:IncidentLock",
    "incident_join": "longrun.incident.exclusive:IncidentJoin",
    "run_launch": "longrun.monitor.launches:RunLaunch",
    "alert_claim": "longrun.incident.alert_identity:AlertClaim",
    "drill_grant": "longrun.drill_grant:DrillGrant",
}


class _Kinds(Mapping[str, type[RecordType]]):
    """kind -> record class, for every kind; a newer kind's class is imported when asked for."""

    def __getitem__(self, kind: str) -> type[RecordType]:
        if kind in SCHEMA_KINDS:
            return SCHEMA_KINDS[kind]
        module, name = _NEWER_KINDS[kind].split(":")
        cls: type[RecordType] = getattr(importlib.import_module(module), name)
        return cls

    def __contains__(self, kind: object) -> bool:  # without importing anything
        return kind in SCHEMA_KINDS or kind in _NEWER_KINDS

    def __iter__(self) -> Iterator[str]:
        return iter((*SCHEMA_KINDS, *_NEWER_KINDS))

    def __len__(self) -> int:
        return len(SCHEMA_KINDS) + len(_NEWER_KINDS)


#: kind -> its record class, every kind the store holds.
KINDS: Mapping[str, type[RecordType]] = _Kinds()


def parse(kind: str, obj: Any) -> RecordType:
    """The record of `kind` in the decoded JSON object `obj`; raises SchemaError (a ValueError) for an
    unknown kind, and the kind's ValueError naming the field for a bad record."""
    if kind not in KINDS:
        raise SchemaError(f"unknown record kind {kind!r}; known: {sorted(KINDS)}")
    return KINDS[kind].from_json(obj)


def loads(kind: str, data: bytes | str) -> RecordType:
    """`parse` of JSON text; bad JSON is a SchemaError too."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise SchemaError(f"{kind} record is not JSON: {e}") from e
    return parse(kind, obj)


__all__ = ["KINDS", "SCHEMA_KINDS", "loads", "parse"]
