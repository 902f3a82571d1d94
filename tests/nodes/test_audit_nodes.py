"""The audit reads node-history records like the other records: a good one is a row; a broken or
misplaced one is a `parsable` finding naming its key."""

from __future__ import annotations

import json

import pytest
from longrun.audit.config import AuditConfig
from longrun.audit.run import AuditFailed, run_audit
from longrun.audit.table import build_table
from longrun.health import history as h

from training.store.local import LocalDirStore


@pytest.fixture
def store(tmp_path):
    s = LocalDirStore(tmp_path / "store")
    h.record(s, "n2", h.SUSPECTED, "inc1", run="r1", incident_id="inc1")
    return s


def test_good_node_events_pass(store):
    table = build_table(store)
    rows = table[table["kind"] == "node_event"]
    assert len(rows) == 1 and bool(rows.iloc[0]["parsable"]) and rows.iloc[0]["incident_id"] == "inc1"
    report = run_audit(store, AuditConfig(audit_id="nodes-ok", sample_size=0))
    assert report.success


@pytest.mark.parametrize(
    ("key", "body", "why"),
    [
        ("nodes/n2/0000000000001-diagnosed-x.json", {"verdict": "maybe"}, "verdict"),
        ("nodes/n3/0000000000001-suspected-inc1.json", {}, "lies under nodes/n3/"),
        ("nodes/n2/0000000000002-suspected-y.json", None, "JSONDecodeError"),
    ],
)
def test_broken_node_events_fail_the_audit(store, key, body, why):
    good = h.events(store, "n2")[0].to_json()
    data = b"{not json" if body is None else json.dumps({**good, "kind": "diagnosed", **body}).encode()
    if "lies under" in why:
        data = json.dumps(good).encode()
    store.put_bytes(key, data)
    row = build_table(store).set_index("key").loc[key]
    assert not row["parsable"] and why in row["error"]
    with pytest.raises(AuditFailed) as info:
        run_audit(store, AuditConfig(audit_id="nodes-bad", sample_size=0))
    assert key in str(info.value) and "parsable" in str(info.value)
