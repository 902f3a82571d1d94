"""The monitor's trigger event as a record (`longrun.monitor.event`): events as the trigger has always
sent them read and give the same object back; a malformed one is refused naming the field; the operator
reads it at the boundary (job_done, error, stale and malformed events; the checkpoint and alert paths
need Slurm and are run by the end-to-end monitor tests). No Slurm, no Airflow database."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException
from longrun.monitor import watch
from longrun.monitor.event import Carry, MonitorEvent
from longrun.monitor.operator import RunMonitorOperator

from training.records.schema import SchemaError
from training.store.local import LocalDirStore

SEEN = (
    '{"run": "r1", "job_id": 42, "steps": [10], "alerts": [], "stale_after_s": 600.0, "since": 1767225600.5}'
)
CARRY = (
    '{"promoted": [{"step": 10, "validated": true, "validate_s": 0.2, "promoted": true,'
    ' "manifest_key": "runs/r1/checkpoints/step_00000010/manifest.json", "seq": 1}],'
    ' "rejected": [{"step": 15, "validated": false, "validate_s": 0.1, "errors": ["shard 0: sha256 mismatch"]}]}'
)
TAIL = f'"seen": {SEEN}, "carry": {CARRY}, "at": 1767225700.25'
#: Payloads as `RunMonitorTrigger` has sent them: `watch.look`'s event (or an error) + seen, carry, at.
EVENTS = {
    "checkpoint": '{"type": "checkpoint", "step": 20, "manifest_key": "runs/r1/checkpoints/step_00000020/manifest.json", '
    + TAIL
    + "}",
    "alert": '{"type": "alert", "alert_key": "runs/r1/alerts/00000040-finite-r001-0.json", '
    '"alert": {"schema_version": 1, "kind": "alert", "run": "r1", "step": 40, "signature": "ab"}, '
    + TAIL
    + "}",
    "job_done": '{"type": "job_done", "outcome": "success", "label": "completed", "message": "COMPLETED (exit 0)", '
    '"state": {"job_id": 42, "status": "COMPLETED", "exit_code": 0}, ' + TAIL + "}",
    "stale": '{"type": "stale", "age_s": 700.1, "progress": {"step": 30, "time": 1767225000.0}, '
    '"message": "run r1: no progress for 700 s (job 42 still running)", ' + TAIL + "}",
    "error": '{"type": "error", "retryable": true, "message": "30 failed looks: timeout", ' + TAIL + "}",
}


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_an_event_as_the_trigger_sent_it_reads_and_gives_the_same_object(name: str) -> None:
    obj = json.loads(EVENTS[name])
    ev = MonitorEvent.from_json(obj)
    assert ev.type == name
    assert ev.seen == watch.Seen(run="r1", job_id=42, steps=(10,), stale_after_s=600.0, since=1767225600.5)
    assert [r["step"] for r in ev.carry.promoted] == [10] and [r["step"] for r in ev.carry.rejected] == [15]
    assert ev.at == 1767225700.25
    assert ev.to_json() == obj
    assert json.dumps(ev.to_json()) == EVENTS[name]  # the same text, key order included


def test_typed_fields_per_type() -> None:
    assert MonitorEvent.from_json(json.loads(EVENTS["checkpoint"])).step == 20
    alert = MonitorEvent.from_json(json.loads(EVENTS["alert"]))
    assert alert.alert_key == "runs/r1/alerts/00000040-finite-r001-0.json" and alert.alert["step"] == 40
    done = MonitorEvent.from_json(json.loads(EVENTS["job_done"]))
    assert (done.outcome, done.label, done.state["exit_code"]) == ("success", "completed", 0)
    assert MonitorEvent.from_json(json.loads(EVENTS["error"])).retryable is True
    stale = MonitorEvent.from_json(json.loads(EVENTS["stale"]))
    assert (stale.age_s, stale.progress, stale.extra) == (700.1, {"step": 30, "time": 1767225000.0}, {})


def test_nulls_and_unknown_fields_come_back_where_they_were() -> None:
    text = f'{{"type": "stale", "age_s": 700, "progress": null, "message": "m", "seen": {SEEN}, "carry": {CARRY}, "note": 1}}'
    ev = MonitorEvent.from_json(json.loads(text))
    assert (ev.age_s, ev.progress, ev.at, ev.extra) == (700, None, None, {"note": 1})
    assert json.dumps(ev.to_json()) == text


def test_carry_starts_empty_and_sorts_gate_results() -> None:
    carry = Carry().add({"step": 5, "validated": True, "promoted": True}).add({"step": 6, "validated": False})
    assert carry.to_json() == {
        "promoted": [{"step": 5, "validated": True, "promoted": True}],
        "rejected": [{"step": 6, "validated": False}],
    }
    assert Carry().to_json() == {"promoted": [], "rejected": []}
    assert Carry.from_json({"promoted": [], "rejected": [], "x": [1]}).to_json() == {
        "promoted": [],
        "rejected": [],
        "x": [1],
    }


@pytest.mark.parametrize(
    ("name", "change", "field"),
    [
        ("job_done", {"type": None}, "'type'"),
        ("job_done", {"seen": None}, "'seen'"),
        ("job_done", {"seen": {"run": "r1"}}, "'seen'"),
        ("checkpoint", {"step": "20"}, "'step'"),
        ("checkpoint", {"step": None}, "'step'"),
        ("alert", {"alert": None}, "'alert'"),
        ("alert", {"alert": ["x"]}, "'alert'"),
        ("alert", {"alert_key": None}, "'alert_key'"),
        ("error", {"retryable": "yes"}, "'retryable'"),
        ("job_done", {"state": "COMPLETED"}, "'state'"),
        ("job_done", {"at": "now"}, "'at'"),
        ("job_done", {"carry": {"promoted": {"step": 1}}}, "'carry.promoted'"),
        ("job_done", {"carry": "x"}, "'carry'"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_field(name: str, change: dict, field: str) -> None:
    with pytest.raises(SchemaError, match=field):
        MonitorEvent.from_json({**json.loads(EVENTS[name]), **change})


@pytest.fixture
def op(tmp_path) -> RunMonitorOperator:
    operator = RunMonitorOperator(task_id="monitor", run_name="r1", job_id=42)
    operator.__dict__["store"] = LocalDirStore(tmp_path)  # the cached_property, an empty store
    return operator


def test_the_operator_returns_the_outcome_of_a_completed_job(op: RunMonitorOperator) -> None:
    out = op.execute_complete({"run_id": "manual__1"}, json.loads(EVENTS["job_done"]))
    carry = json.loads(CARRY)
    assert out == {
        "outcome": "completed",
        "run": "r1",
        "job_id": 42,
        "state": {"job_id": 42, "status": "COMPLETED", "exit_code": 0},
        "promoted": carry["promoted"],
        "rejected": carry["rejected"],
    }


def test_the_operator_fails_a_job_that_failed(op: RunMonitorOperator) -> None:
    event = {
        **json.loads(EVENTS["job_done"]),
        "outcome": "failed",
        "label": "sdc_verdict",
        "message": "FAILED",
    }
    with pytest.raises(AirflowFailException, match="ended FAILED without an alert record"):
        op.execute_complete({"run_id": "manual__1"}, event)


def test_the_operator_retries_a_retryable_error_and_fails_the_others(op: RunMonitorOperator) -> None:
    event = json.loads(EVENTS["error"])
    with pytest.raises(RuntimeError, match="could not look: 30 failed looks: timeout") as e:
        op.execute_complete({"run_id": "manual__1"}, event)
    assert not isinstance(e.value, AirflowFailException)
    with pytest.raises(AirflowFailException, match="failed: 30 failed looks"):
        op.execute_complete({"run_id": "manual__1"}, {**event, "retryable": False})
    with pytest.raises(AirflowFailException, match="no progress for 700 s.*runbook"):
        op.execute_complete({"run_id": "manual__1"}, json.loads(EVENTS["stale"]))


def test_the_operator_fails_a_job_slurm_holds_after_a_failed_launch_with_its_runbook(
    op: RunMonitorOperator,
) -> None:
    event = {
        **json.loads(EVENTS["job_done"]),
        "type": "launch_held",
        "message": "run r1: Slurm holds job 42 after a failed launch (job 42 PENDING"
        " reason=launch_failed_requeued_held restarts=1); it will not start until it is released",
    }
    for field in ("outcome", "label"):
        event.pop(field, None)
    with pytest.raises(AirflowFailException, match="holds job 42.*runbooks/job-held-after-failed-launch.md"):
        op.execute_complete({"run_id": "manual__1"}, event)


def test_the_operator_fails_an_entrypoint_without_records_for_good(op: RunMonitorOperator) -> None:
    """AirflowFailException: no retry (a retry would watch the same job that wrote nothing)."""
    event = {
        **json.loads(EVENTS["job_done"]),
        "type": "no_records",
        "label": "no_records",
        "message": "run r1: job 42 ended (...) but its entrypoint script:/e/loop.py wrote no longrun records"
        " (no progress, no segment of this job, no report): nothing it trained was checked. The entrypoint"
        " must use training.api (docs/adopting.md)",
    }
    with pytest.raises(
        AirflowFailException, match=r"wrote no longrun records.*training\.api \(docs/adopting\.md\)"
    ):
        op.execute_complete({"run_id": "manual__1"}, event)


@pytest.mark.parametrize("event", [None, [], {"type": "job_done"}, {"seen": json.loads(SEEN)}])
def test_the_operator_fails_a_malformed_event(op: RunMonitorOperator, event: object) -> None:
    with pytest.raises(AirflowFailException, match="malformed monitor event"):
        op.execute_complete({"run_id": "manual__1"}, event)


def test_the_operator_fails_an_unknown_event_type(op: RunMonitorOperator) -> None:
    with pytest.raises(AirflowFailException, match="unknown monitor event type 'later'"):
        op.execute_complete({"run_id": "manual__1"}, {**json.loads(EVENTS["job_done"]), "type": "later"})
