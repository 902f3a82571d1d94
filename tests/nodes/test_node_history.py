"""What sdc_incident's tasks tell the node history (local-directory store; no Slurm needed for these
steps): suspicions, a second incident marks the node for replacement, the incident record says so, and
the node to drain is still the alert's only."""

from __future__ import annotations

from longrun.health import history as h
from longrun.health.policy import NodePolicy
from longrun.incident import record, runner, steps
from longrun.tasks import node_history

from training.records import schema
from training.store.local import LocalDirStore


def incident(run: str, step: int, node: str = "n2") -> runner.Incident:
    alert = schema.record(
        "alert", run=run, step=step, check="weight_vote", suspect_ranks=[1], suspect_nodes=[node], evidence={}
    )
    return runner.Incident(
        run=run,
        alert_key=f"runs/{run}/alerts/{step:08d}-weight_vote-r001-1.json",
        alert=alert,
        job_id=None,
        run_params={"run_name": run, "incident_mode": "act"},
    )


def attribute(store, inc):
    steps.open_record(store, inc)
    out = steps.attribute(store, inc)
    return out, node_history.after_attribute(store, store, inc, out, NodePolicy())


def test_second_incident_marks_the_node_for_replacement(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    first = incident("r1", 5)
    out, st = attribute(store, first)
    assert out["node"] == "n2" and st is not None and not st["repeat_offender"]
    attribute(store, first)  # a retried task adds nothing
    assert [e.kind for e in h.events(store, "n2")] == [h.SUSPECTED]
    node_history.after_drain(store, first, {"node": "n2", "reason": "longrun:sdc:r1:5"})
    node_history.after_diagnose(
        store, first, "n2", {"verdict": "pass", "reason": "longrun:diag-pass:r1:5", "details": {}}
    )

    second = incident("r2", 9)
    out, st = attribute(store, second)
    assert out["node"] == "n2"  # history never changes which node the evidence names
    assert st is not None and st["repeat_offender"] and st["suspicions_in_window"] == 2
    kinds = [e.kind for e in h.events(store, "n2")]
    assert kinds == [h.SUSPECTED, h.DRAINED, h.DIAGNOSED, h.SUSPECTED, h.REPLACE]
    rec = record.load(store, run="r2", incident_id=second.incident_id)
    assert rec["node_history"]["repeat_offender"] is True
    assert node_history.REPEAT_OFFENDER_RUNBOOK in rec["runbooks"]
    assert h.events(store, "n3") == []


def test_a_failed_diagnosis_marks_for_replacement_and_observe_records_nothing(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    inc = incident("r1", 5, node="n4")
    node_history.after_drain(store, inc, {"node": "n4", "observe": True})
    node_history.after_diagnose(store, inc, "n4", {"node": "n4", "observe": True})
    assert h.events(store, "n4") == []
    node_history.after_diagnose(
        store,
        inc,
        "n4",
        {
            "verdict": "fail",
            "reason": "longrun:diag-fail:r1:5",
            "details": {"probe": {"result": {"fingerprint": "ab"}}},
        },
    )
    evs = h.events(store, "n4")
    assert [e.kind for e in evs] == [h.DIAGNOSED, h.REPLACE]
    assert evs[0].evidence["fingerprint"] == "ab" and h.state(evs) == "replace"


def test_the_drain_records_the_suspicion_when_attribute_could_not(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    inc = incident("r1", 5, node="n1")
    node_history.after_drain(store, inc, {"node": "n1", "reason": "longrun:sdc:r1:5"})
    evs = h.events(store, "n1")
    assert [e.kind for e in evs] == [h.SUSPECTED, h.DRAINED] and evs[0].evidence["check"] == "weight_vote"
