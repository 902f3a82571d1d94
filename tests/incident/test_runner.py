"""The incident step runner (incident/runner.py): load, skip what is done, observe, act, record.

On a local directory store (the runner touches only the store; the steps that use it run on real Slurm in
test_steps_slurm.py, test_keep_drained_slurm.py, tests/security and the e2e drills). Also pins the event
names: they are the text on disk, so old records keep reading and new ones read as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from longrun.incident import record, runbooks, steps
from longrun.incident.events import Event
from longrun.incident.runner import Incident, IncidentStop, Outcome, run, write

from training import schema
from training.records import Incident as IncidentRecord
from training.records import IncidentStatus
from training.store import LocalDirStore, ObjectStore

RUN = "runner-r1"

# The event names written before they became an enum (the JSON on disk): never rename one.
WRITTEN_BEFORE = {
    "opened", "alert_seen", "frozen", "would_freeze", "attributed", "drained", "would_drain",
    "drain_refused", "foreign_drain", "restored", "reference", "diagnosed", "would_diagnose", "picked",
    "relaunch_submitted", "relaunch_failed", "relaunched_running", "would_relaunch", "no_spare_left",
    "released", "directive_written", "directive_not_followed", "kept_job_cancelled",
    "first_healthy_step", "closed", "release_refused", "release_deferred", "diagnosis_in_job_skipped",
}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return LocalDirStore(tmp_path / "store")


def _incident(mode: str = "act", seen_at: float | None = None) -> Incident:
    alert = schema.record(
        "alert", run=RUN, step=17, check="recompute", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )
    key = schema.store_key(RUN, schema.alert_path(17, "recompute", "r000-1700000017"))
    params = {"run_name": RUN, "incident_mode": mode}
    return Incident(run=RUN, alert_key=key, alert=alert, job_id=5, run_params=params, alert_seen_at=seen_at)


def _never(rec: dict) -> Outcome:
    raise AssertionError("must not run")


def test_event_names_are_the_text_on_disk() -> None:
    assert {e.value for e in Event} == WRITTEN_BEFORE
    assert all(isinstance(e, str) and e == e.value for e in Event)


def test_act_records_event_fields_status_and_runbook_once(store: ObjectStore) -> None:
    inc = _incident()
    steps.open_record(store, inc)
    out = Outcome(
        event=Event.DRAINED,
        data={"node": "n2"},
        fields={"drain": {"node": "n2"}},
        status=IncidentStatus.FAILED,
        runbook=runbooks.FOREIGN_DRAIN,
        result={"node": "n2"},
    )
    assert run(store, inc, act=lambda rec: out) == {"node": "n2"}
    again = Outcome(event=Event.DRAINED, data={"node": "n9"}, runbook=runbooks.FOREIGN_DRAIN)
    run(store, inc, act=lambda rec: again)  # no `done`: acts again, the event stays the first one
    rec = inc.rec(store)
    assert [e["event"] for e in rec["timeline"]] == ["opened", "drained"]
    assert record.event(rec, "drained")["node"] == "n2"
    assert rec["drain"] == {"node": "n2"} and rec["status"] == "failed"
    assert rec["runbooks"].count(runbooks.FOREIGN_DRAIN) == 1
    # the JSON on disk holds plain strings, and the typed reader reads it
    typed = IncidentRecord.from_json(rec)
    assert typed.status is IncidentStatus.FAILED and typed.event("drained") is not None


def test_done_returns_the_earlier_result_without_acting(store: ObjectStore) -> None:
    inc = _incident()
    steps.open_record(store, inc)
    write(store, inc, Outcome(event=Event.PICKED, fields={"checkpoint": {"step": 10}}))
    before = inc.rec(store)
    got = run(store, inc, done=lambda rec: rec.get("checkpoint") or None, act=_never, observe=_never)
    assert got == {"step": 10} and inc.rec(store) == before


def test_observe_mode_records_the_would_event_and_does_not_act(store: ObjectStore) -> None:
    inc = _incident(mode="observe")
    steps.open_record(store, inc)
    would = Outcome(event=Event.WOULD_DRAIN, data={"node": "n2"}, result={"observe": True})
    assert run(store, inc, observe=lambda rec: would, act=_never) == {"observe": True}
    assert record.event(inc.rec(store), "would_drain")["node"] == "n2"
    # act mode ignores `observe`
    act_inc = _incident(mode="act")
    assert run(store, act_inc, observe=_never, act=lambda rec: Outcome(result={"acted": 1})) == {"acted": 1}


def test_stop_records_first_then_raises(store: ObjectStore) -> None:
    inc = _incident()
    steps.open_record(store, inc)
    out = Outcome(event=Event.DRAIN_REFUSED, status=IncidentStatus.FAILED, stop="refused. Runbook: x.md")
    with pytest.raises(IncidentStop, match="refused. Runbook: x.md"):
        run(store, inc, act=lambda rec: out)
    rec = inc.rec(store)
    assert rec["status"] == "failed" and record.has_event(rec, "drain_refused")


def test_an_outcome_without_event_writes_nothing(store: ObjectStore) -> None:
    inc = _incident()
    steps.open_record(store, inc)
    before = store.head(record.record_key(RUN, inc.incident_id))
    assert run(store, inc, act=lambda rec: Outcome(result={"in_job": True})) == {"in_job": True}
    assert store.head(record.record_key(RUN, inc.incident_id)) == before


def test_alert_seen_keeps_the_trigger_time(store: ObjectStore) -> None:
    inc = _incident(seen_at=123.5)
    steps.open_record(store, inc)
    steps.open_record(store, inc)  # a rerun adds nothing
    rec = inc.rec(store)
    seen = [e for e in rec["timeline"] if e["event"] == "alert_seen"]
    assert seen == [{"event": "alert_seen", "time": 123.5}]
