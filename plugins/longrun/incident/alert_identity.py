"""One alert, one incident: an alert is known by what it says, not by the key it was found under.

The incident id is the alert key's file stem (`training.records.schema.incident_id_for`), and every key
under `runs/<run>/alerts/` is on the job's side of the store: any job identity can copy a genuine alert
(signature and all) to a new key, and anyone allowed to trigger `sdc_incident` can name that key. Each
copy would open a new incident, take a new drain slot and leave a new mark in the node's history.

So before an incident acts, it claims the alert's identity (`claim`): a digest of the verdict the signed
record states (`IDENTITY_FIELDS`: run, job, step, check, suspect ranks and nodes), recorded at
`runs/<run>/alert-claims/<identity>.json` on the orchestrator side, created only if absent. The first
incident to claim it acts; every other alert with the same identity (a copy under a new key, a second
rank's record of the same verdict) finds that incident and joins it instead of opening its own.

Left out of the identity on purpose: the writer's rank and the time (two ranks writing one verdict are
one verdict), the evidence (a copy is the same evidence; a different one at the same step, check and
suspects of the same job is still the same fault) and the signature (a function of the rest and the key).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.records import schema, signing
from training.records.alert import Alert
from training.records.base import Declared
from training.records.fields import Field, epoch_seconds, non_empty, opt_float, opt_str, run_name
from training.store.interface import ObjectStore, dump_json
from training.store.update import create_or_read

KIND = "alert_claim"
SCHEMA_VERSION = 1
CLAIMS_DIR = "alert-claims/"
#: What an alert's identity is made of (the job id is the signed `job_id`, null when the alert has none).
IDENTITY_FIELDS = ("run", "job_id", "step", "check", "suspect_ranks", "suspect_nodes")


def identity_of(alert: Mapping[str, Any]) -> str:
    """The identity of the alert record `alert` (hex); SchemaError when it does not read as an alert."""
    a = Alert.from_json(alert)
    job_id = alert.get("job_id")
    verdict = {
        "run": a.run,
        "job_id": job_id if isinstance(job_id, int) and not isinstance(job_id, bool) else None,
        "step": a.step,
        "check": a.check,
        "suspect_ranks": sorted(a.suspect_ranks),
        "suspect_nodes": sorted(a.suspect_nodes),
    }
    return hashlib.sha256(signing.canonical_json(verdict)).hexdigest()[:40]


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertClaim(Declared):
    """Which incident handles the alert with this identity."""

    KIND = KIND
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "identity": Field(opt_str, checks=(non_empty,)),
        "incident_id": Field(opt_str, checks=(non_empty,)),
        "alert_key": Field(opt_str, checks=(non_empty,)),
        "claimed_at": Field(opt_float, checks=(epoch_seconds,)),
    }

    run: str
    """Run name."""
    identity: str
    """The alert's identity (`identity_of`)."""
    incident_id: str
    """The incident that claimed it first."""
    alert_key: str
    """The key that incident's alert was read from."""
    claimed_at: float
    """Epoch seconds."""
    schema_version: int = SCHEMA_VERSION


def claim_key(run: str, identity: str) -> str:
    return schema.store_key(run, f"{CLAIMS_DIR}{identity}.json")


def claim(
    store: ObjectStore, *, run: str, alert: Mapping[str, Any], incident_id: str, alert_key: str
) -> AlertClaim:
    """Claim `alert`'s identity for `incident_id`; the claim that stands: this one, or the first
    incident's (then `incident_id` must join that one and act on nothing)."""
    mine = AlertClaim(
        run=run,
        identity=identity_of(alert),
        incident_id=incident_id,
        alert_key=alert_key,
        claimed_at=time.time(),
    )
    first = create_or_read(store, claim_key(run, mine.identity), dump_json(mine.to_json()))
    return mine if first.created else AlertClaim.from_json(first.data)
