"""The `Declared` record idiom (training.records.base), on the kinds that use it: each field declared once
(`training.records.fields.Field`) gives the reader, the writer and the checks at construction.

What the record corpus (tests/test_record_corpus.py) cannot see, it writes sorted keys: the key order of
`to_json` as the writers wrote it before issue 27 (the XCom and log lines keep it), the fields a reader
keeps or drops, a field written only with another, and the checks on a record built in code. No mocks:
the real record classes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from longrun.alert_auth import AlertKey
from longrun.drill_grant import DrillGrant
from longrun.incident.alert_identity import AlertClaim
from longrun.incident.exclusive import IncidentLock
from longrun.monitor.launches import RunLaunch
from longrun.runclaim import RunClaim
from longrun.security_events import SecurityEvent

from training.records.schema import SchemaError
from training.segment import FaultFired, Segment
from training.spares.directive import Directive

T = 1764430000.5
GRANT = DrillGrant(
    run="r1", dag_run_id="manual__1", kind="sick-node", step=17, target="n2", set_by="admin",
    allowed_as="role ADMIN", fault_state_dir="/runs/r1/fault-state", granted_at=T,
)  # fmt: skip
SEGMENT = Segment(
    run="r1", segment_id="7.0-r0", job_id="7", restart_count=0, start_step=0, resumed_from=None,
    started_at=T, world_size=2, nodes=("n1", "n2"),
)  # fmt: skip
DIRECTIVE = Directive(
    run="r1", job_id="7", attempt=1, nodes=("n1", "n3"), resume_from="runs/r1/checkpoints/x/",
    incident_id="i1", exclude=("n2",), issued_at=T,
)  # fmt: skip
LAUNCH = RunLaunch(
    run="r1", attempt=1, dag_run_id="r1__attempt1", job_id=7, incident_id="i1",
    params={"run_name": "r1"}, recorded_at=T,
)  # fmt: skip

#: Each kind's `to_json` keys, in the order its writer wrote them before issue 27.
ORDERS: list[tuple[Any, list[str]]] = [
    (RunClaim(run="r1", dag_run_id="d", claimed_at=T), ["schema_version", "kind", "run", "dag_run_id", "claimed_at"]),
    (
        AlertClaim(run="r1", identity="ab", incident_id="i1", alert_key="k", claimed_at=T),
        ["schema_version", "kind", "run", "identity", "incident_id", "alert_key", "claimed_at"],
    ),
    (
        IncidentLock(run="r1", incident_id="i1", job_id=None, acquired_at=T),
        ["schema_version", "kind", "run", "incident_id", "job_id", "acquired_at"],
    ),
    (
        SecurityEvent(run="r1", reason="unsigned", details={"k": 1}, at=T),
        ["run", "reason", "details", "at", "kind", "schema_version", "runbook"],
    ),
    (
        AlertKey(run="r1", tag="t", key="ab", time=T, job_id=7, extra={"zz": 1}),
        ["schema_version", "kind", "run", "tag", "key", "time", "zz", "job_id"],
    ),
    (AlertKey(run="r1", key="ab"), ["schema_version", "kind", "run", "key"]),
    (
        GRANT,
        ["schema_version", "kind", "run", "dag_run_id", "drill_kind", "step", "target", "set_by", "allowed_as",
         "fault_state_dir", "granted_at"],
    ),
    (
        dataclasses.replace(LAUNCH, extra={"zz": 1}),
        ["schema_version", "kind", "run", "attempt", "dag_run_id", "job_id", "incident_id", "params",
         "recorded_at", "zz"],
    ),
    (
        SEGMENT,
        ["run", "segment_id", "job_id", "restart_count", "start_step", "resumed_from", "started_at", "world_size",
         "nodes", "first_step", "first_healthy_step", "first_healthy_time", "last_step", "ended_at", "exit",
         "schema_version", "kind"],
    ),
    (
        DIRECTIVE,
        ["run", "job_id", "attempt", "nodes", "resume_from", "incident_id", "exclude", "issued_at",
         "schema_version", "kind"],
    ),
    (
        FaultFired(run="r1", fault="nan", step=5, rank=1, node="n2", time=T, spec="nan:5:1"),
        ["run", "fault", "step", "rank", "node", "time", "spec", "schema_version", "kind"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "rec, order", ORDERS, ids=lambda x: type(x).__name__ if not isinstance(x, list) else ""
)
def test_to_json_keeps_each_kinds_key_order_and_reads_back(rec: Any, order: list[str]) -> None:
    out = rec.to_json()
    assert list(out) == order
    again = type(rec).from_json(json.dumps(out))  # JSON text reads too
    assert again == rec
    assert json.dumps(again.to_json()) == json.dumps(out)


def test_unknown_fields_are_kept_by_the_kinds_with_extra_and_dropped_by_the_others() -> None:
    key = AlertKey.from_json({**AlertKey(run="r1", key="ab").to_json(), "new": [1]})
    assert key.extra == {"new": [1]} and key.to_json()["new"] == [1]
    launch = RunLaunch.from_json({**LAUNCH.to_json(), "new": 2})
    assert launch.to_json()["new"] == 2
    claim = RunClaim.from_json({**RunClaim(run="r1", dag_run_id="d", claimed_at=T).to_json(), "new": 3})
    assert "new" not in claim.to_json()
    event = SecurityEvent.from_json(SecurityEvent(run="r1", reason="unsigned", at=T).to_json())
    assert event.to_json()["runbook"] == "runbooks/security-event.md"  # written, never a field


def test_a_field_written_with_another_appears_only_with_it() -> None:
    assert "ended_at" not in GRANT.to_json() and "ended_by" not in GRANT.to_json()
    ended = dataclasses.replace(GRANT, ended_at=T + 1)
    assert ended.to_json()["ended_at"] == T + 1 and ended.to_json()["ended_by"] is None
    assert DrillGrant.from_json(ended.to_json()) == ended


def test_a_field_always_written_must_be_present_even_as_null() -> None:
    obj = IncidentLock(run="r1", incident_id="i1", job_id=None, acquired_at=T).to_json()
    assert IncidentLock.from_json(obj).job_id is None
    for cls, rec, name in ((IncidentLock, obj, "job_id"), (RunLaunch, LAUNCH.to_json(), "params")):
        with pytest.raises(SchemaError, match=f"{cls.KIND} record lacks field '{name}'"):
            cls.from_json({k: v for k, v in rec.items() if k != name})


BAD: list[tuple[Any, dict[str, Any], str]] = [
    (RunClaim(run="r1", dag_run_id="d", claimed_at=T), {"dag_run_id": ""}, "run_claim record field 'dag_run_id'"),
    (RunClaim(run="r1", dag_run_id="d", claimed_at=T), {"run": "../x"}, "run_claim record field 'run'"),
    (RunClaim(run="r1", dag_run_id="d", claimed_at=T), {"claimed_at": True}, "run_claim record field 'claimed_at'"),
    (IncidentLock(run="r1", incident_id="i1", job_id=None, acquired_at=T), {"job_id": "7"},
     "incident_lock record field 'job_id'"),
    (SecurityEvent(run="r1", reason="unsigned", at=T), {"reason": "Bad!"}, "security_event record field 'reason'"),
    (SecurityEvent(run="r1", reason="unsigned", at=T), {"at": -1}, "security_event record field 'at'"),
    (GRANT, {"kind": "meteor"}, "drill_grant record field 'drill_kind'"),
    (GRANT, {"step": 0}, "drill_grant record field 'step'"),
    (GRANT, {"target": "n 2"}, "drill_grant record field 'target'"),
    (GRANT, {"fault_state_dir": "rel"}, "drill_grant record field 'fault_state_dir'"),
    (LAUNCH, {"attempt": -1}, "run_launch record field 'attempt'"),
    (LAUNCH, {"params": {"run_name": "r2"}}, "run_launch record field 'params'"),
    (SEGMENT, {"segment_id": "a/b"}, "segment record field 'segment_id'"),
    (SEGMENT, {"exit": "crashed"}, "segment record field 'exit'"),
    (SEGMENT, {"first_step": 0}, "segment record field 'first_step'"),
    (DIRECTIVE, {"job_id": "7a"}, "directive record field 'job_id'"),
    (DIRECTIVE, {"nodes": ("n1", "n2")}, "directive record field 'nodes'"),
    (DIRECTIVE, {"resume_from": "a/../b"}, "directive record field 'resume_from'"),
    (FaultFired(run="r1", fault="nan", step=5, rank=1, node="n2", time=T, spec="s"), {"rank": -1},
     "fault record field 'rank'"),
]  # fmt: skip


@pytest.mark.parametrize("rec, change, message", BAD, ids=[m for _, _, m in BAD])
def test_a_bad_field_is_refused_in_code_and_when_read_naming_kind_and_field(
    rec: Any, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError, match=message):
        dataclasses.replace(rec, **change)
    stored = rec.to_json()
    for name, value in change.items():
        field = type(rec).FIELDS[name]
        stored[field.key or name] = list(value) if isinstance(value, tuple) else value
    with pytest.raises(SchemaError, match=message):
        type(rec).from_json(stored)


def test_every_record_class_declares_each_attribute_once_in_its_fields() -> None:
    """One idiom (issue 27): every record, part and small record is a `Declared` whose `FIELDS` names
    every attribute but the stamp, `extra` and `as_read`, so no attribute is read or written by hand and
    none is left out of `to_json`."""
    from longrun.health.history import NodeEvent
    from longrun.monitor.event import Carry, MonitorEvent
    from longrun.nodes.outcome import NodeProbe, NodeReturn

    from training.records import KINDS
    from training.records.base import Declared, Part, Record
    from training.records.diagnosis import Diagnosis, NodeCheck, Probe, ProbeResult
    from training.records.incident import Attribution, Closing, Drain, Recovery, Relaunch, RestartCheckpoint

    parts = (Attribution, Closing, Drain, Recovery, Relaunch, RestartCheckpoint, Diagnosis, NodeCheck)
    parts += (Probe, ProbeResult, Carry, MonitorEvent, NodeProbe, NodeReturn)
    classes = [KINDS[k] for k in KINDS] + list(parts)
    assert NodeEvent in classes
    for cls in classes:
        assert issubclass(cls, Declared), cls
        own = {"schema_version", "extra", "as_read"}
        attributes = {f.name for f in dataclasses.fields(cls)} - own  # type: ignore[arg-type]
        assert attributes == set(cls.FIELDS), cls
    assert all(issubclass(c, Part) for c in parts)
    assert all(issubclass(KINDS[k], Record) for k in ("alert", "check", "incident", "report"))
