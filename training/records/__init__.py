"""Typed records: one frozen dataclass per record kind, each with `from_json` (validates, raises a
ValueError naming the field) and `to_json`. Pure Python: no torch, no Airflow, no boto3.

    alert = Alert.from_json(json.loads(body))       # attributes, not .get() chains
    alert.world.world_size, alert.suspect_nodes

`parse(kind, obj)` builds the record of a kind named at run time; `loads(kind, data)` decodes JSON bytes
first. The key layout is in `training.schema`; the read model of a whole run is `longrun.runview`.
"""

from __future__ import annotations

import json
from typing import Any

from training.records.base import Record
from training.records.job import Alert, CheckRecord, Manifest, Progress, Report, Save, World
from training.records.orchestrator import (
    Incident,
    IncidentStatus,
    Pick,
    Promotion,
    SuspectMark,
    TimelineEvent,
    Validation,
)
from training.schema import SchemaError

#: kind -> its record class (every kind `training.schema` knows).
KINDS: dict[str, type[Record]] = {
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


def parse(kind: str, obj: Any) -> Record:
    """The record of `kind` in the decoded JSON object `obj`; raises SchemaError (a ValueError)."""
    if kind not in KINDS:
        raise SchemaError(f"unknown record kind {kind!r}; known: {sorted(KINDS)}")
    return KINDS[kind].from_json(obj)


def loads(kind: str, data: bytes | str) -> Record:
    """`parse` of JSON text; bad JSON is a SchemaError too."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise SchemaError(f"{kind} record is not JSON: {e}") from e
    return parse(kind, obj)


__all__ = [
    "KINDS",
    "Alert",
    "CheckRecord",
    "Incident",
    "IncidentStatus",
    "Manifest",
    "Pick",
    "Progress",
    "Promotion",
    "Record",
    "Report",
    "Save",
    "SchemaError",
    "SuspectMark",
    "TimelineEvent",
    "Validation",
    "World",
    "loads",
    "parse",
]
