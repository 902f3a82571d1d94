"""node_return's summary after the approval (local-directory store): a Reject keeps the node drained (the
DAG skipped `resume`), records who rejected it in the node's history, and fails the run. The Airflow
half (a real human-in-the-loop Reject) is in test_node_return_airflow.py."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException
from helpers.local_store import use_local_store
from longrun.health import history as h
from longrun.tasks.node_return import rejection, summary_task

SELECTED = {"nodes": ["n3"], "refused": {}, "mode": "approve", "repeats": 1, "requested": ["n3"]}
PROBED = [{"node": "n3", "clean": True, "rounds": [{"round": 1, "verdict": "pass"}]}]
REJECT = {"chosen_options": ["Reject"], "params_input": {}, "responded_by_user": {"id": "7", "name": "ops"}}


@pytest.fixture
def store(tmp_path, monkeypatch):
    return use_local_store(tmp_path, monkeypatch)


def test_a_reject_is_recorded_and_fails_the_run(store):
    with pytest.raises(AirflowFailException, match="rejected the return"):
        summary_task(SELECTED, None, probed=PROBED, approval=REJECT, dag_run_id="manual__r1")
    evs = h.events(store, "n3")
    assert [e.kind for e in evs] == [h.RETURN_REFUSED]
    assert evs[0].source == "node_return.manual__r1" and "(ops) rejected" in (evs[0].reason or "")
    # a retried summary does not record it twice
    with pytest.raises(AirflowFailException):
        summary_task(SELECTED, None, probed=PROBED, approval=REJECT, dag_run_id="manual__r1")
    assert len(h.events(store, "n3")) == 1


def test_a_reject_seen_as_the_skip_record(store):
    """What Airflow 3.3.2 leaves on a Reject: no return value, the skip record naming `resume`."""
    skipped = {"skipped": ["resume"]}
    with pytest.raises(AirflowFailException, match="rejected the return"):
        summary_task(SELECTED, None, probed=PROBED, approval=None, skipped=skipped, dag_run_id="manual__r2")
    assert [e.kind for e in h.events(store, "n3")] == [h.RETURN_REFUSED]
    assert rejection(None, {"skipped": ["summary"]}) is None


def test_only_a_reject_in_approve_mode_counts(store):
    assert rejection({"chosen_options": ["Approve"]}) is None
    assert rejection(None) is None and rejection("Reject") is None
    assert (
        rejection({"chosen_options": ["Reject"]})
        == "a person (unknown) rejected the return at approve_return"
    )
    returned = [{"node": "n3", "returned": True}]
    act = {**SELECTED, "mode": "act"}
    assert summary_task(act, returned, probed=PROBED, approval=REJECT)["returned"] == ["n3"]
    assert summary_task(SELECTED, returned, probed=PROBED, approval=REJECT)["returned"] == ["n3"]
    assert h.events(store, "n3") == []
