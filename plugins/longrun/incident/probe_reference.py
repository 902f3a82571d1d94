"""The replay probe's reference: a known-good fingerprint per partition, computed once on a healthy node.

The diagnosis compares the suspect node's probe fingerprint with it. It is only valid for the same
software and CPU level (`PROBE_ENV`): a reference from another environment makes no verdict.
Orchestrator side of the store (`ops/probe-reference/<partition>.json`), written once (If-None-Match).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from training.records import Incident as IncidentRecord
from training.records.diagnosis import ProbeResult
from training.store import ObjectStore, PreconditionFailed, StoreError, put_json

# The probe's environment: a reference fingerprint is only valid for the same software and CPU level.
PROBE_ENV = ("torch", "cpu_capability", "threads")


def _reference_key(partition: str) -> str:
    return f"ops/probe-reference/{partition}.json"


def cached_reference(store: ObjectStore, partition: str) -> dict[str, Any] | None:
    """A known-good probe result from an earlier incident in this partition (nodes of one kind), or None."""
    try:
        ref = json.loads(store.get_bytes(_reference_key(partition)))
    except (StoreError, ValueError):
        return None
    return ref if isinstance(ref, dict) and ref.get("fingerprint") else None


def reference_of(rec: IncidentRecord) -> ProbeResult | None:
    """The reference an earlier try of this incident recorded (event `reference`, field `reference`), or
    None."""
    return rec.reference or None


def remember_reference(store: ObjectStore, partition: str, ref: Mapping[str, Any]) -> None:
    try:
        put_json(store, _reference_key(partition), dict(ref), if_none_match=True)
    except PreconditionFailed:
        pass  # one is there already (ours, or a concurrent incident's: equal by construction)


def reference_matches(ref: Mapping[str, Any], probe: Mapping[str, Any]) -> bool:
    """Is `ref` a valid reference for this probe run (same torch, CPU level, threads)?"""
    return all(ref.get(k) == probe.get(k) for k in PROBE_ENV)
