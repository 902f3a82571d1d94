"""The incident step runner (incident/runner.py): load, skip what is done, observe, act, record.

On a local directory store (the runner touches only the store; the steps that use it run on real Slurm in
test_steps_slurm.py, test_keep_drained_slurm.py, tests/security and the e2e drills). Also pins the event
names: they are the text on disk, so old records keep reading and new ones read as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from longrun.incident import record, runbooks, steps
from longrun.incident.events import Event
from longrun.incident.runner import Incident, IncidentStop, Outcome, run, write

from training.records import schema
from training.records.orchestrator import Incident as IncidentRecord
from training.records.orchestrator import IncidentStatus
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore

RUN = "runner-r1"

# The event names written before they became an enum (the JSON on disk): never rename one.
WRITTEN_BEFORE = {
    "opened", "alert_seen", "frozen", "would_freeze", "attributed", "drained", "would_drain",
    "drain_refused", "foreign_drain", "restored", "reference", "diagnosed", "would_diagnose", "picked",
    "relaunch_submitted", "relaunch_failed", "relaunched_running", "would_relaunch", "no_spare_left",
    "released", "directive_written", "directive_not_followed", "kept_job_cancelled",
    "first_healthy_step", "closed", "release_refused", "release_deferred", "diagnosis_in_job_skipped",
    "drain_rejected", "authenticated", "earlier_step_running", "diagnosed_in_job", "drill_ended",
    "relaunch_lost", "kept_job_ended",
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


def _never(rec: IncidentRecord) -> Outcome:
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
    assert [e.event for e in rec.timeline] == [Event.OPENED, Event.DRAINED]
    drained = rec.event(Event.DRAINED)
    assert drained is not None and drained.details == {"node": "n2"}
    assert rec.drain.node == "n2" and rec.status is IncidentStatus.FAILED
    assert rec.runbooks.count(runbooks.FOREIGN_DRAIN) == 1
    # the JSON on disk holds plain strings
    raw = record.load(store, run=RUN, incident_id=inc.incident_id)
    assert raw["status"] == "failed" and raw["drain"] == {"node": "n2"}


def test_done_returns_the_earlier_result_without_acting(store: ObjectStore) -> None:
    inc = _incident()
    steps.open_record(store, inc)
    write(store, inc, Outcome(event=Event.PICKED, fields={"checkpoint": {"step": 10}}))
    before = inc.rec(store)
    got = run(store, inc, done=lambda rec: rec.checkpoint.to_json() or None, act=_never, observe=_never)
    assert got == {"step": 10} and inc.rec(store) == before


def test_observe_mode_records_the_would_event_and_does_not_act(store: ObjectStore) -> None:
    inc = _incident(mode="observe")
    steps.open_record(store, inc)
    would = Outcome(event=Event.WOULD_DRAIN, data={"node": "n2"}, result={"observe": True})
    assert run(store, inc, observe=lambda rec: would, act=_never) == {"observe": True}
    would_drain = inc.rec(store).event(Event.WOULD_DRAIN)
    assert would_drain is not None and would_drain.details == {"node": "n2"}
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
    assert rec.status is IncidentStatus.FAILED and record.has_event(rec, Event.DRAIN_REFUSED)


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
    seen = [e.to_json() for e in rec.timeline if e.event == Event.ALERT_SEEN]
    assert seen == [{"event": "alert_seen", "time": 123.5}]


# A record as an older writer left it: fields the typed record does not declare (`reference`, `note`),
# a declared field set to null, whole numbers where the typed record reads floats, a timeline entry
# without a time. The runner reads it typed, and what it writes back is this JSON plus the change only.
OLDER = """{
 "alert": {"check": "recompute", "evidence": {}, "kind": "alert", "run": "runner-r1", "schema_version": 1,
  "step": 17, "suspect_nodes": ["n2"], "suspect_ranks": [1], "time": 1700000017},
 "alert_key": "KEY",
 "diagnosis": {"duration_s": 3, "node": "n2", "runbook": null, "verdict": "pass", "zeta": [1, 2]},
 "drain": {"drained_now": true, "in_window": 1, "node": "n2", "reason": "longrun-sdc"},
 "incident_id": "ID",
 "kind": "incident",
 "mode": "act",
 "note": {"kept": "as written"},
 "reference": {"fingerprint": "ab", "node": "n1", "threads": 4},
 "run": "runner-r1",
 "runbooks": ["runbooks/recompute-mismatch.md"],
 "schema_version": 1,
 "status": "open",
 "time_to_recover_s": 12,
 "timeline": ["opened", {"event": "drained", "node": "n2", "time": 1700000020}]
}"""


def test_the_runner_hands_the_typed_record_and_writes_the_json_back_as_read(store: ObjectStore) -> None:
    inc = _incident()
    key = record.record_key(RUN, inc.incident_id)
    text = OLDER.replace("KEY", inc.alert_key).replace("ID", inc.incident_id)
    older = json.loads(text)
    store.put_bytes(key, json.dumps(older, sort_keys=True, indent=1).encode())
    seen: list[IncidentRecord] = []

    def done(rec: IncidentRecord) -> dict | None:
        seen.append(rec)
        return rec.diagnosis.to_json() if rec.diagnosis else None

    # a step done before: the typed record goes to `done`, its result is the recorded part, nothing written
    before = store.get_bytes(key)
    assert run(store, inc, done=done, act=_never) == older["diagnosis"]
    assert isinstance(seen[0], IncidentRecord) and seen[0].drain.node == "n2"
    assert seen[0].event(Event.DRAINED) is not None and store.get_bytes(key) == before

    # a step that acts: the stored JSON gains the event, the field and the status, and nothing else changes
    out = Outcome(event=Event.PICKED, data={"step": 10}, at=1700000030.5, fields={"lost_steps": 7},
                  status=IncidentStatus.RELAUNCHED)  # fmt: skip
    assert run(store, inc, act=lambda rec: out if rec.drain else _never(rec)) == {}
    older["timeline"].append({"event": "picked", "time": 1700000030.5, "step": 10})
    older.update(lost_steps=7, status="relaunched")
    assert store.get_bytes(key) == json.dumps(older, sort_keys=True, indent=1).encode()
    # the same step again adds no second event (the field and status are set to what they are)
    run(store, inc, act=lambda rec: out)
    assert store.get_bytes(key) == json.dumps(older, sort_keys=True, indent=1).encode()


def test_the_runner_and_add_event_write_an_event_the_same_way(store: ObjectStore, monkeypatch) -> None:
    """One change of the stored JSON (`record.apply_event`) for both writers: the event once, at the
    outcome's `at` or the record's clock, its data after the time, the fields merged."""
    monkeypatch.setattr(record, "_now", lambda: 1767225600.5)  # the record's clock, not the runner's own
    inc = _incident()
    steps.open_record(store, inc)
    write(store, inc, Outcome(event=Event.DRAINED, data={"node": "n2"}, fields={"drain": {"node": "n2"}}))
    write(store, inc, Outcome(event=Event.PICKED, at=1767225601, data={"step": 10}))
    write(store, inc, Outcome(event=Event.PICKED, at=5.0, data={"step": 99}, fields={"lost_steps": 7}))
    inc.event(store, Event.RELAUNCH_SUBMITTED, fields={"lost_steps": 7}, job_id=6)
    inc.event(store, Event.RELAUNCH_SUBMITTED, job_id=60)
    raw = record.load(store, run=RUN, incident_id=inc.incident_id)
    assert raw["timeline"][1:] == [
        {"event": "drained", "time": 1767225600.5, "node": "n2"},
        {"event": "picked", "time": 1767225601, "step": 10},
        {"event": "relaunch_submitted", "time": 1767225600.5, "job_id": 6},
    ]
    assert raw["drain"] == {"node": "n2"} and raw["lost_steps"] == 7
    rec: dict = {"timeline": []}
    record.apply_event(rec, None, fields={"x": 1})
    assert rec == {"timeline": [], "x": 1}
