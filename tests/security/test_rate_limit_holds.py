"""The drain rate limit holds (issue 10, item 6): ledger entries from the future or unreadable count for
nothing and are reported; the approve mode lifts the limit only for a listed operator other than the
user who triggered the run. (That the job's identity cannot write or delete the ledger at all is
tests/security/test_store_sides.py.)"""

from __future__ import annotations

import json

import pytest
from longrun import security_events
from longrun.health.ratelimit import LEDGER_KEY, DrainPolicy, DrainRefused, entries, reserve_drain
from longrun.incident import approval

from training.store.interface import get_json, put_json
from training.store.local import LocalDirStore

NOW = 1_800_000_000.0
YEAR = 365 * 24 * 3600.0


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def _plant(store, *entries_: dict) -> None:
    put_json(store, LEDGER_KEY, {"schema_version": 1, "kind": "drain_ledger", "entries": list(entries_)})


def test_entries_from_the_future_do_not_block_real_drains_and_are_reported(store) -> None:
    """The attack: entries dated a year ahead sit in every window forever. Before, two of them refused
    every drain ("rate limit: 2 drains in the last 3600 s")."""
    _plant(
        store,
        {"incident_id": "x1", "node": "n1", "run": "victim", "time": NOW + YEAR},
        {"incident_id": "x2", "node": "n3", "run": "victim", "time": NOW + YEAR},
    )
    grant = reserve_drain(
        store, incident_id="real", node="n2", run="r", policy=DrainPolicy(max_drains=2), now=NOW
    )
    assert not grant.already and grant.in_window == 1
    assert [e["incident_id"] for e in entries(store)] == ["real"]
    ledger = get_json(store, LEDGER_KEY)
    assert [q["entry"]["incident_id"] for q in ledger["quarantined"]] == ["x1", "x2"]
    events = security_events.events(store, "victim")
    assert [e.reason for e in events] == ["ledger_future_entry", "ledger_future_entry"]
    assert all(e.details["ignored"] for e in events)
    # reported once: a later reservation finds nothing to quarantine
    reserve_drain(
        store, incident_id="real2", node="n4", run="r", policy=DrainPolicy(max_drains=5), now=NOW + 1
    )
    assert len(security_events.events(store, "victim")) == 2


def test_unreadable_entries_count_for_nothing(store) -> None:
    """Before, a `time` that is not a number made every reservation raise (no drain at all)."""
    _plant(
        store,
        {"incident_id": "x", "node": "n1", "run": "r", "time": "soon"},
        {"incident_id": "y", "run": "r", "time": NOW},
        {"incident_id": "z", "node": "n1", "run": "r", "time": float("nan")},
        "not an entry",
    )
    grant = reserve_drain(store, incident_id="real", node="n2", run="r", now=NOW)
    assert grant.in_window == 1
    assert [e.reason for e in security_events.events(store, "r")] == ["ledger_bad_entry"] * 4


def test_recent_and_slightly_skewed_entries_still_count(store) -> None:
    policy = DrainPolicy(max_drains=2, window_s=3600)
    _plant(
        store,
        {"incident_id": "a", "node": "n1", "run": "r", "time": NOW - 60},
        {"incident_id": "b", "node": "n3", "run": "r", "time": NOW + 120},  # another worker's clock
    )
    with pytest.raises(DrainRefused, match="rate limit: 2 drains"):
        reserve_drain(store, incident_id="c", node="n2", run="r", policy=policy, now=NOW)
    assert security_events.events(store, "r") == []
    assert json.loads(store.get_bytes(LEDGER_KEY)).get("quarantined") is None


# ---- approve mode: who lifts the limit ------------------------------------------------------------


def _approval(user: dict | None, option: str = "Approve") -> dict:
    return {"chosen_options": [option], "params_input": {}, "responded_by_user": user}


ALICE = {"id": "alice", "name": "alice"}
OPS = {"id": "ops-1", "name": "olga"}


@pytest.mark.parametrize(
    ("response", "triggered_by", "approvers", "allowed", "why"),
    [
        (None, "alice", ["olga"], False, "no approval"),
        (_approval(OPS, "Reject"), "alice", ["olga"], False, "no approval"),
        (_approval(None), "alice", ["olga"], False, "did not record who"),
        (_approval(ALICE), "alice", ["alice", "olga"], False, "triggered the run and approved it"),
        (_approval(OPS), "alice", [], False, "lists no operator"),
        (_approval({"id": "bob", "name": "bob"}), "alice", ["olga"], False, "not an operator"),
        (_approval(OPS), "alice", ["olga"], True, "lifted the rate limit"),
        (_approval(OPS), "alice", ["ops-1"], True, "lifted the rate limit"),
        (_approval(OPS), None, ["olga"], False, "did not record who triggered the run"),
    ],
)
def test_only_another_listed_operator_lifts_the_limit(
    response, triggered_by, approvers, allowed, why
) -> None:
    d = approval.decide(response=response, triggered_by=triggered_by, approvers=approvers)
    assert d.allowed is allowed and why in d.why


def test_the_triggering_user_approving_keeps_both_limits(store) -> None:
    """End to end through the ledger: the decision is what reaches `operator_override`."""
    reserve_drain(store, incident_id="i1", node="n1", run="r", now=NOW)
    self_approved = approval.decide(response=_approval(ALICE), triggered_by="alice", approvers=["alice"])
    with pytest.raises(DrainRefused, match="needs an operator"):
        reserve_drain(
            store, incident_id="i1", node="n2", run="r", now=NOW + 1, operator_override=self_approved.allowed
        )
    other = approval.decide(response=_approval(OPS), triggered_by="alice", approvers=["olga"])
    grant = reserve_drain(
        store, incident_id="i1", node="n2", run="r", now=NOW + 2, operator_override=other.allowed
    )
    assert grant.in_window == 2
