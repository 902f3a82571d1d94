"""The incident record: keyed by the alert, created once, events added once, readable summary."""

from __future__ import annotations

import pytest
from longrun.incident import record, runbooks
from longrun.incident.events import Event

from training.records import schema
from training.store.local import LocalDirStore

ALERT_KEY = "runs/r1/alerts/00000017-recompute-r000-1764430000.json"


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


@pytest.fixture
def alert():
    return schema.record(
        "alert",
        run="r1",
        step=17,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={},
        time=100.0,
    )


def test_incident_id_is_the_alert_stem():
    assert schema.incident_id_for(ALERT_KEY) == "00000017-recompute-r000-1764430000"
    with pytest.raises(ValueError, match="alert_key"):
        schema.incident_id_for("runs/r1/alerts/")


def test_open_twice_gives_the_same_record(store, alert):
    a = record.open_incident(store, run="r1", alert=alert, alert_key=ALERT_KEY, mode="act")
    b = record.open_incident(store, run="r1", alert=alert, alert_key=ALERT_KEY, mode="observe")
    assert a == b and b["mode"] == "act"
    assert b["runbooks"] == [runbooks.RECOMPUTE_MISMATCH]
    assert b["timeline"][0]["alert_time"] == 100.0 and b["alert"] == alert
    key = "runs/r1/incidents/00000017-recompute-r000-1764430000.json"
    assert store.head(key) is not None
    schema.validate("incident", record.load(store, run="r1", incident_id=a["incident_id"]))


def test_events_are_added_once_and_fields_merged(store, alert):
    rec = record.open_incident(store, run="r1", alert=alert, alert_key=ALERT_KEY, mode="act")
    iid = rec["incident_id"]
    record.add_event(store, run="r1", incident_id=iid, name="drained", node="n2")
    rec = record.add_event(
        store, run="r1", incident_id=iid, name="drained", node="n9", fields={"status": "open"}
    )
    assert [e["event"] for e in rec["timeline"]] == ["opened", "drained"]  # the JSON as written
    typed = record.load_typed(store, run="r1", incident_id=iid)
    drained = typed.event(Event.DRAINED)
    assert drained is not None and drained.details == {"node": "n2"}
    assert record.has_event(typed, Event.DRAINED) and not record.has_event(typed, Event.RELAUNCHED_RUNNING)
    assert record.on_timeline(rec, Event.DRAINED) and not record.on_timeline(rec, Event.RELAUNCHED_RUNNING)


def test_summary_tells_the_story(store, alert):
    rec = record.open_incident(store, run="r1", alert=alert, alert_key=ALERT_KEY, mode="act")
    rec = record.add_event(
        store,
        run="r1",
        incident_id=rec["incident_id"],
        name="relaunched_running",
        fields={
            "attribution": {"verdict": "node", "node": "n2", "reason": "r"},
            "diagnosis": {"verdict": "fail", "summary": "probe fail"},
            "checkpoint": {"step": 10, "why": "newest promoted at or before 16"},
            "lost_steps": 7,
            "relaunch": {"job_id": 5, "nodes": ["n1", "n3", "n4"], "exclude": ["n2"]},
            "time_to_recover_s": 12.5,
            "status": record.RELAUNCHED,
        },
    )
    text = record.summary(rec)
    for part in ("n2", "probe fail", "step 10", "lost steps: 7", "12.5 s", "relaunched_running", "runbooks/"):
        assert part in text


def test_lost_steps():
    assert record.lost_steps(alert_step=17, checkpoint_step=10) == 7
    with pytest.raises(ValueError, match="checkpoint_step=20"):
        record.lost_steps(alert_step=17, checkpoint_step=20)
