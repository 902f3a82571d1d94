"""The drain ledger: per-window and per-incident limits, idempotent, safe with concurrent writers."""

from __future__ import annotations

import threading

import pytest
from longrun.health.ratelimit import DrainPolicy, DrainRefused, entries, reserve_drain

from training.store.local import LocalDirStore


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


#: The ledger as `reserve_drain` wrote it before its entries had a type (sorted keys, indent 1); the
#: second entry's integer time is kept as written.
LEDGER_WRITTEN = (
    b'{\n "entries": [\n  {\n   "incident_id": "i1",\n   "node": "n2",\n   "override": false,\n'
    b'   "run": "r",\n   "time": 1000.5\n  },\n  {\n   "incident_id": "i2",\n   "node": "n3",\n'
    b'   "override": true,\n   "run": "r",\n   "time": 1100\n  }\n ],\n "kind": "drain_ledger",\n'
    b' "schema_version": 1\n}'
)


def test_a_ledger_written_before_reads_and_a_new_drain_keeps_its_entries_byte_for_byte(store):
    import json

    from longrun.health.ratelimit import LEDGER_KEY, DrainEntry

    old = json.loads(LEDGER_WRITTEN)
    assert [DrainEntry.from_json(e).to_json() for e in old["entries"]] == old["entries"]
    e = DrainEntry.from_json(old["entries"][1])
    assert (e.incident_id, e.node, e.time, e.extra) == ("i2", "n3", 1100, {"override": True, "run": "r"})
    store.put_bytes(LEDGER_KEY, LEDGER_WRITTEN)
    g = reserve_drain(store, incident_id="i3", node="n4", run="r2", now=1200.0, operator_override=True)
    assert (g.already, g.in_window) == (False, 3)
    new = {"incident_id": "i3", "node": "n4", "override": True, "run": "r2", "time": 1200.0}
    expected = {**old, "entries": [*old["entries"], new]}
    assert store.get_bytes(LEDGER_KEY) == json.dumps(expected, sort_keys=True, indent=1).encode()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"incident_id": None}, "'incident_id'"),
        ({"incident_id": 7}, "'incident_id'"),
        ({"node": ["n2"]}, "'node'"),
        ({"time": None}, "'time'"),
        ({"time": "1000"}, "'time'"),
        ({"time": True}, "'time'"),
        ({"time": float("nan")}, "'time'"),
    ],
)
def test_a_malformed_ledger_entry_is_refused_naming_the_field(change, field):
    from longrun.health.ratelimit import DrainEntry

    from training.records.schema import SchemaError

    good = {"incident_id": "i1", "node": "n2", "run": "r", "time": 1000.5, "override": False}
    with pytest.raises(SchemaError, match=field):
        DrainEntry.from_json({**good, **change})
