"""The drain ledger: per-window and per-incident limits, idempotent, safe with concurrent writers."""

from __future__ import annotations

import threading

import pytest
from longrun.incident.ratelimit import DrainPolicy, DrainRefused, entries, reserve_drain

from training.store import LocalDirStore


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def test_grant_is_recorded_and_idempotent(store):
    g1 = reserve_drain(store, incident_id="i1", node="n2", run="r", now=1000.0)
    g2 = reserve_drain(store, incident_id="i1", node="n2", run="r", now=1005.0)
    assert (g1.already, g2.already) == (False, True)
    assert g2.time == 1000.0
    assert [e["node"] for e in entries(store)] == ["n2"]


def test_one_node_per_incident_without_an_operator(store):
    reserve_drain(store, incident_id="i1", node="n2", run="r", now=1000.0)
    with pytest.raises(DrainRefused, match="needs an operator"):
        reserve_drain(store, incident_id="i1", node="n3", run="r", now=1001.0)
    g = reserve_drain(store, incident_id="i1", node="n3", run="r", now=1002.0, operator_override=True)
    assert not g.already and g.in_window == 2


def test_window_limit_then_the_window_slides(store):
    policy = DrainPolicy(max_drains=2, window_s=600)
    reserve_drain(store, incident_id="a", node="n1", run="r", policy=policy, now=1000.0)
    reserve_drain(store, incident_id="b", node="n2", run="r", policy=policy, now=1100.0)
    with pytest.raises(DrainRefused, match=r"rate limit: 2 drains in the last 600 s"):
        reserve_drain(store, incident_id="c", node="n3", run="r", policy=policy, now=1200.0)
    # n1's drain leaves the window at 1600.
    g = reserve_drain(store, incident_id="c", node="n3", run="r", policy=policy, now=1601.0)
    assert g.in_window == 2


def test_policy_validation_names_the_field():
    with pytest.raises(ValueError, match="max_drains=0"):
        DrainPolicy(max_drains=0)
    with pytest.raises(ValueError, match="window_s=-1"):
        DrainPolicy(window_s=-1)
    with pytest.raises(ValueError, match="max_nodes_per_incident=True"):
        DrainPolicy(max_nodes_per_incident=True)


def test_concurrent_writers_never_exceed_the_limit(store):
    policy = DrainPolicy(max_drains=3, window_s=3600)
    granted, refused = [], []

    def attempt(i):
        try:
            granted.append(reserve_drain(store, incident_id=f"i{i}", node=f"n{i}", run="r", policy=policy))
        except DrainRefused:
            refused.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(granted) == 3 and len(refused) == 5
    assert len(entries(store)) == 3
