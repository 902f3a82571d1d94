"""Typed records: every kind reads what the writers write today, gives the same JSON back, keeps fields a
newer writer added, and refuses a bad record with an error that names the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from helpers.check_batches import put_check_batches

from training import records
from training.records import schema
from training.records.alert import Alert, AlertRef, World
from training.records.job import CheckRecord, Manifest
from training.records.orchestrator import (
    Incident,
    IncidentStatus,
    Pick,
    Promotion,
    SuspectMark,
    TimelineEvent,
)

T = 1764430000.5
WORLD = {"nodes": ["n1", "n2", "n3"], "ranks": ["n1", "n2", "n3"], "world_size": 3}

# One record of every kind, as its writer builds it today (schema.record with the writer's fields).
WRITTEN: dict[str, dict[str, Any]] = {
    "alert": schema.record(
        "alert",
        run="r1",
        step=17,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"losses": [1.0, 2.0], "world": WORLD},
        update_applied=False,
        exit_code=93,
        rank_of_writer=0,
        time=T,
    ),
    "check": schema.record(
        "check", run="r1", step=5, check="finite", verdict="pass", rank=0, duration_s=0.001, loss=2.5
    ),
    "progress": schema.record(
        "progress", run="r1", step=5, loss=None, step_time_s=0.2, total_steps=40, world_size=3, time=T
    ),
    "manifest": schema.record(
        "manifest",
        run="r1",
        step=10,
        files=[{"name": "model.pt", "sha256": "ab", "size": 1}],
        fingerprints={"w": "cd"},
        weight_vote={"verdict": "pass", "ranks": 3},
        coverage={"recompute": 10},
        loss=2.0,
        code_version="abc",
        world=WORLD,
        time=T,
    ),
    "save": schema.record("save", run="r1", step=10, ok=False, error="boom", writer="thread", time=T),
    "validation": schema.record(
        "validation", run="r1", step=10, ok=True, errors=[], validation_id="v", time=T
    ),
    "promotion": schema.record(
        "promotion", run="r1", step=10, manifest_key="runs/r1/x", seq=2, previous_step=5, time=T
    ),
    "pick": schema.record("pick", run="r1", alert={"step": 17}, step=None, why="nothing before", time=T),
    "suspect": schema.record(
        "suspect", run="r1", after_step=10, reason="incident x", incident_id="x", time=T
    ),
    "incident": schema.record(
        "incident",
        run="r1",
        incident_id="00000017-recompute-r000-1",
        alert={"step": 17, "check": "recompute"},
        timeline=[{"event": "opened", "time": T, "alert_time": T - 1}, {"event": "drained", "time": T + 1}],
        mode="act",
        status="relaunched",
        lost_steps=7,
        runbooks=["runbooks/recompute-mismatch.md"],
    ),
    "report": schema.record("report", run="r1", final_step=40, final_fingerprint="ef", time=T),
}


def test_every_kind_has_a_class() -> None:
    assert set(records.SCHEMA_KINDS) == set(schema.REQUIRED)
    assert set(records.KINDS) == set(schema.REQUIRED) | set(NEWER)


def _newer() -> dict[str, tuple[Any, tuple[str, ...]]]:
    """One record of each newer kind (a dataclass of its own), as its writer builds it, and the fields
    its reader requires."""
    from longrun.alert_auth import AlertKey
    from longrun.drill_grant import DrillGrant
    from longrun.health.history import NodeEvent
    from longrun.incident.alert_identity import AlertClaim
    from longrun.incident.exclusive import IncidentJoin, IncidentLock
    from longrun.monitor.launches import RunLaunch
    from longrun.runclaim import RunClaim
    from longrun.security_events import SecurityEvent

    from training.segment import FaultFired, Segment
    from training.spares.directive import Directive

    return {
        "segment": (
            Segment(
                run="r1", segment_id="7.0-r0", job_id="7", restart_count=0, start_step=0,
                resumed_from=None, started_at=T, world_size=3, nodes=("n1", "n2", "n3"),
                first_healthy_step=1, first_healthy_time=T + 1,
            ),
            ("run", "segment_id", "restart_count", "start_step", "started_at", "world_size", "nodes"),
        ),
        "fault": (
            FaultFired(run="r1", fault="nan", step=5, rank=1, node="n2", time=T, spec="nan:5:1"),
            ("run", "fault", "step", "rank", "node", "time", "spec"),
        ),
        "directive": (
            Directive(
                run="r1", job_id="7", attempt=1, nodes=("n1", "n3"), resume_from="runs/r1/checkpoints/x/",
                incident_id="i1", exclude=("n2",), issued_at=T,
            ),
            ("run", "job_id", "attempt", "nodes", "resume_from", "incident_id", "exclude", "issued_at"),
        ),
        "node_event": (
            NodeEvent(node="n2", kind="drained", time=T, source="i1", run="r1", reason="longrun:sdc:r1:5"),
            ("node", "kind", "time", "source"),
        ),
        "run_claim": (
            RunClaim(run="r1", dag_run_id="manual__1", claimed_at=T),
            ("schema_version", "run", "dag_run_id", "claimed_at"),
        ),
        "security_event": (
            SecurityEvent(run="r1", reason="unsigned", details={"key": "alerts/x.json"}, at=T),
            ("run", "reason", "at", "kind", "schema_version"),
        ),
        "alert_key": (
            AlertKey(run="r1", tag="t-1", key="ab12", time=T, job_id=7),
            ("run", "key", "kind", "schema_version"),
        ),
        "incident_lock": (
            IncidentLock(run="r1", incident_id="00000017-recompute-r000-1", job_id=None, acquired_at=T),
            ("run", "incident_id", "job_id", "acquired_at", "kind", "schema_version"),
        ),
        "incident_join": (
            IncidentJoin(run="r1", incident_id="i2", alert_key="runs/r1/alerts/y.json", joined="i1"),
            ("run", "incident_id", "alert_key", "joined", "kind", "schema_version"),
        ),
        "run_launch": (
            RunLaunch(
                run="r1", attempt=1, dag_run_id="r1__attempt1", job_id=7, incident_id="i1",
                params={"run_name": "r1", "attempt": 1, "incident_mode": "act"}, recorded_at=T,
            ),
            ("run", "attempt", "dag_run_id", "job_id", "incident_id", "params", "recorded_at", "kind"),
        ),
        "alert_claim": (
            AlertClaim(run="r1", identity="ab12", incident_id="i1", alert_key="runs/r1/alerts/x.json", claimed_at=T),
            ("run", "identity", "incident_id", "alert_key", "claimed_at", "kind", "schema_version"),
        ),
        "drill_grant": (
            DrillGrant(
                run="r1", dag_run_id="manual__1", kind="sick-node", step=17, target="n2", set_by="admin",
                allowed_as="role ADMIN", fault_state_dir="/runs/r1/fault-state", granted_at=T,
            ),
            ("run", "dag_run_id", "drill_kind", "step", "target", "set_by", "allowed_as", "fault_state_dir",
             "granted_at"),
        ),
    }  # fmt: skip


NEWER = (
    "segment", "fault", "directive", "node_event", "run_claim", "security_event", "alert_key", "incident_lock",
    "incident_join", "run_launch", "alert_claim", "drill_grant",
)  # fmt: skip


@pytest.mark.parametrize("kind", NEWER)
def test_newer_kinds_are_registered_and_round_trip(kind: str) -> None:
    """The kinds that are dataclasses of their own read through the same registry as the others, give
    their stored JSON back, and name a missing required field."""
    rec, required = _newer()[kind]
    assert records.KINDS[kind] is type(rec)
    written = json.loads(json.dumps(rec.to_json()))
    assert records.parse(kind, written) == rec
    assert records.loads(kind, json.dumps(written)).to_json() == written
    for field in required:
        with pytest.raises(ValueError, match=field):
            records.parse(kind, {k: v for k, v in written.items() if k != field})


@pytest.mark.parametrize("kind", sorted(WRITTEN))
def test_round_trip_gives_the_written_json_back(kind: str) -> None:
    written = json.loads(json.dumps(WRITTEN[kind]))
    rec = records.parse(kind, written)
    assert rec.to_json() == written
    assert records.loads(kind, json.dumps(written)).to_json() == written


@pytest.mark.parametrize("kind", sorted(WRITTEN))
def test_every_missing_required_field_is_named(kind: str) -> None:
    for field in schema.REQUIRED[kind]:
        obj = {k: v for k, v in WRITTEN[kind].items() if k != field}
        with pytest.raises(ValueError, match=field):
            records.parse(kind, obj)


def test_wrong_types_and_values_are_named() -> None:
    with pytest.raises(ValueError, match="suspect_ranks"):
        Alert.from_json({**WRITTEN["alert"], "suspect_ranks": ["1"]})
    with pytest.raises(ValueError, match="update_applied"):
        Alert.from_json({**WRITTEN["alert"], "update_applied": "yes"})
    with pytest.raises(ValueError, match="status"):
        Incident.from_json({**WRITTEN["incident"], "status": 3})
    newer = Incident.from_json({**WRITTEN["incident"], "status": "escalated"})  # a newer writer's status
    assert newer.status == "escalated" and not isinstance(newer.status, IncidentStatus)
    assert Incident.from_json({**WRITTEN["incident"], "status": "closed"}).status is IncidentStatus.CLOSED
    with pytest.raises(ValueError, match="timeline"):
        Incident.from_json({**WRITTEN["incident"], "timeline": [{"time": T}]})
    with pytest.raises(ValueError, match="kind"):
        Alert.from_json({**WRITTEN["alert"], "kind": "check"})
    with pytest.raises(ValueError, match="schema_version"):
        Alert.from_json({**WRITTEN["alert"], "schema_version": schema.SCHEMA_VERSION + 1})
    with pytest.raises(ValueError, match="not JSON"):
        records.loads("alert", b"{")
    with pytest.raises(ValueError, match="unknown record kind"):
        records.parse("ledger", {})


def test_attributes_instead_of_lookups() -> None:
    alert = Alert.from_json(WRITTEN["alert"])
    assert alert.suspect_nodes == ("n2",) and alert.update_applied is False and alert.exit_code == 93
    assert alert.world == World(world_size=3, nodes=("n1", "n2", "n3"), ranks=("n1", "n2", "n3"))
    assert alert.extra == {"rank_of_writer": 0}
    incident = Incident.from_json(WRITTEN["incident"])
    assert incident.status is IncidentStatus.RELAUNCHED and incident.status == "relaunched"
    assert incident.event("drained") == TimelineEvent(event="drained", time=T + 1)
    assert incident.event("opened").details == {"alert_time": T - 1}  # type: ignore[union-attr]
    assert incident.opened_at == T and incident.lost_steps == 7


def test_where_alerts_name_each_ranks_node() -> None:
    """`Alert.rank_nodes`: the names and places checks have used for the node of every rank."""
    base = {k: v for k, v in WRITTEN["alert"].items() if k != "evidence"}
    assert Alert.from_json({**base, "evidence": {"world": WORLD}}).rank_nodes == ("n1", "n2", "n3")
    assert Alert.from_json({**base, "evidence": {"rank_nodes": ["n1", "n4"]}}).rank_nodes == ("n1", "n4")
    beside = {**base, "evidence": {}, "world": {"world_nodes": ["n3"]}}
    assert Alert.from_json(beside).rank_nodes == ("n3",)
    assert Alert.from_json({**base, "evidence": {"world": {"nodes": []}}}).rank_nodes == ()


def test_a_check_record_states_its_world() -> None:
    assert records.parse("check", {**WRITTEN["check"], "world_size": 3}).world_size == 3  # type: ignore[attr-defined]
    assert records.parse("check", WRITTEN["check"]).world_size is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="world_size"):
        records.parse("check", {**WRITTEN["check"], "world_size": "3"})


def test_old_shapes_still_read() -> None:
    """Version-1 records from older writers: the world as `size` or as a rank count, a timeline of bare
    event names, an incident without status, an alert without the optional fields."""
    assert World.from_json({"size": 4}).world_size == 4
    assert World.from_json({"ranks": 3}).world_size == 3
    assert World.from_json({"ranks": ["n1", "n1"]}).world_size == 2
    assert World.from_json({}).world_size is None
    old = {k: v for k, v in WRITTEN["manifest"].items()}
    old["world"] = {"size": 3, "nodes": ["n1", "n2", "n3"]}
    assert Manifest.from_json(old).world.world_size == 3
    inc = {k: v for k, v in WRITTEN["incident"].items() if k != "status"}
    inc["timeline"] = ["opened"]
    parsed = Incident.from_json(inc)
    assert parsed.status is None and parsed.timeline == (TimelineEvent(event="opened", time=None),)
    bare = {k: v for k, v in WRITTEN["alert"].items() if k not in ("update_applied", "exit_code")}
    assert Alert.from_json(bare).update_applied is None
    with pytest.raises(ValueError, match="world_size"):
        World.from_json({"world_size": 0})


def test_the_suspect_rule() -> None:
    mark = SuspectMark.from_json(WRITTEN["suspect"])
    assert not mark.demotes(10, saved_at=T - 5)  # at the last known-good step
    assert mark.demotes(20, saved_at=T - 5)  # after it, saved before the mark
    assert not mark.demotes(20, saved_at=T + 5)  # saved again by the relaunch, after the mark
    assert mark.demotes(20, saved_at=None)  # by step alone
    explicit = SuspectMark.from_json({**WRITTEN["suspect"], "steps": [30]})
    assert explicit.demotes(30, saved_at=T + 5) and not explicit.demotes(20, saved_at=T - 5)


def test_the_registry_does_not_pull_in_the_orchestrator() -> None:
    """The job imports `training.records` (segments, faults, directives read through it); naming the
    orchestrator's kinds must not import `longrun` there, nor must asking whether a kind exists."""
    import subprocess
    import sys

    code = (
        "import sys, training.records as r, training.segment, training.spares.directive\n"
        "assert 'node_event' in r.KINDS and 'x' not in r.KINDS and r.KINDS['segment'].__name__ == 'Segment'\n"
        "print(sorted(m for m in sys.modules if m == 'longrun' or m.startswith(('longrun.', 'airflow', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (
            {"step": 27, "check": "recompute", "suspect_nodes": ["n3"], "time": 5},
            (27, "recompute", ("n3",), 5),
        ),
        ({"check": "finite"}, (None, "finite", (), None)),  # a partial copy still shows what it has
        (
            {"step": True, "check": 5, "suspect_nodes": "n3", "time": True},
            (None, None, (), None),
        ),  # wrong types
        ({"step": "27", "suspect_nodes": None, "time": "5"}, (None, None, (), None)),
        (["not", "an", "object"], (None, None, (), None)),
        (None, (None, None, (), None)),
    ],
)
def test_an_alert_copy_reads_tolerantly_and_never_raises(obj: Any, want: tuple) -> None:
    ref = AlertRef.from_json(obj)
    assert (ref.step, ref.check, ref.suspect_nodes, ref.time) == want


def test_an_incident_reads_its_partial_alert_copy_tolerantly() -> None:
    rec = schema.record(
        "incident", run="r1", incident_id="i", alert={"step": 9, "check": 3}, timeline=[], mode="act"
    )
    ref = Incident.from_json(rec).alert_ref
    assert (ref.step, ref.check, ref.suspect_nodes) == (9, None, ())


def test_a_check_records_vote_evidence_reads_as_attributes() -> None:
    def check(evidence: dict) -> CheckRecord:
        rec = schema.record(
            "check",
            run="r",
            step=1,
            check="weight_vote",
            verdict="fail",
            rank=0,
            duration_s=0.1,
            evidence=evidence,
        )
        return CheckRecord.from_json(rec)

    rec = check({"replicas": 4, "fingerprints_by_rank": {"0": "a", "1": "b"}})
    assert rec.replicas == 4 and rec.fingerprints_by_rank == {"0": "a", "1": "b"}
    for odd in ({"replicas": True}, {"replicas": "4"}, {"replicas": 0}, {"fingerprints_by_rank": ["a"]}, {}):
        assert check(odd).replicas is None and check(odd).fingerprints_by_rank == {}, odd


@pytest.mark.parametrize(
    ("evidence", "want"),
    [
        ({"nodes": ["n1", "n2"], "world": {"nodes": ["n9"]}}, ("n1", "n2")),  # evidence.nodes only
        ({"world": {"nodes": ["n9"]}}, ()),
        ({"nodes": "n1"}, ()),
        ({"nodes": None}, ()),
    ],
)
def test_an_alert_names_the_nodes_its_evidence_lists(evidence: dict, want: tuple) -> None:
    alert = schema.record(
        "alert", run="r1", step=3, check="finite", suspect_ranks=[0], suspect_nodes=["n1"], evidence=evidence
    )
    assert Alert.from_json(alert).evidence_nodes == want


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        ({"evidence": {"world": {"world_size": 4, "nodes": ["n1"]}}}, 4),
        ({"evidence": {"world": {"world_size": 0}}}, None),
        ({"evidence": {"world": {"world_size": True}}}, None),
        ({"evidence": {"world": {"size": 4}}}, None),  # only world_size, as the pick always read it
        ({"evidence": {"world": [4]}}, None),
        ({"evidence": "world"}, None),
        ({}, None),
    ],
)
def test_an_alert_copy_reads_its_world_size_tolerantly(obj: Any, want: int | None) -> None:
    assert AlertRef.from_json(obj).world_size == want


def test_a_pick_as_pick_pre_incident_writes_it_reads_back(tmp_path: Any) -> None:
    """The stored contract of a pick is what `pick_pre_incident` writes: `last_known_good` is `{check:
    step}`, a step null for a check that never passed on every rank (then `bound`, `step` and `key` are
    null too). The typed reader takes that record and gives its JSON back."""
    from longrun.checkpoints.pick import pick_pre_incident

    from training.store.local import LocalDirStore

    store = LocalDirStore(tmp_path)
    passes = [(c, s, r) for c in ("recompute", "weight_vote") for s in (10, 20) for r in (0, 1)]
    lines = [
        schema.record(
            "check", run="r1", step=s, check=c, verdict="pass", rank=r, duration_s=0.01, world_size=2
        )
        for c, s, r in passes
        if not (c == "weight_vote" and r == 1)  # the vote never passed on every rank
    ]
    put_check_batches(store, "r1", lines)
    step, _why = pick_pre_incident(store, "r1", {"check": "recompute", "step": 25, "suspect_nodes": ["n2"]})
    assert step is None
    [info] = store.list(schema.store_key("r1", "picks/"))
    stored = json.loads(store.get_bytes(info.key))
    pick = records.parse("pick", stored)
    assert isinstance(pick, Pick)
    assert pick.last_known_good == {"recompute": 20, "weight_vote": None}
    assert pick.step is None and pick.bound is None and pick.key is None
    assert pick.to_json() == stored  # the nulls it read stay, as written
    with pytest.raises(ValueError, match="last_known_good"):
        records.parse("pick", {**stored, "last_known_good": 20})
    with pytest.raises(ValueError, match="last_known_good"):
        records.parse("pick", {**stored, "last_known_good": {"recompute": "20"}})


def test_a_record_read_writes_back_what_it_read_and_one_built_what_its_writer_writes() -> None:
    """An optional field read as null (or empty) is written back as read, an absent one stays absent; a
    record built in code leaves its unset optional fields out; a value set since the read wins."""
    first = {**WRITTEN["promotion"], "previous_step": None}
    assert records.parse("promotion", first).to_json() == first
    assert records.parse("promotion", WRITTEN["promotion"]).to_json() == WRITTEN["promotion"]
    absent = {k: v for k, v in WRITTEN["promotion"].items() if k != "previous_step"}
    assert records.parse("promotion", absent).to_json() == absent
    explicit_none = {**WRITTEN["suspect"], "incident_id": None, "steps": []}
    mark = SuspectMark.from_json(explicit_none)
    assert mark.to_json() == explicit_none and mark.steps == ()
    built = Promotion(run="r1", step=10, manifest_key="runs/r1/x", time=T, seq=1)
    assert "previous_step" not in built.to_json() and "by" not in built.to_json()
    moved = dataclasses.replace(Promotion.from_json(first), previous_step=4)
    assert moved.to_json()["previous_step"] == 4
    loss = {**WRITTEN["check"], "loss": None}
    assert records.parse("check", loss).to_json() == loss
