"""helpers.fleet_records: a test sees no other test's fleet-wide records, and leaves them as they were."""

from __future__ import annotations

import pytest
from helpers.fleet_records import fleet_records_set_aside

from training.store.local import LocalDirStore


def test_fleet_records_are_empty_inside_and_restored_after(tmp_path) -> None:
    store = LocalDirStore(tmp_path)
    before = {"nodes/n2/0001-suspected-a.json": b"old", "ops/drain-ledger.json": b'{"entries": []}'}
    for key, body in before.items():
        store.put_bytes(key, body)
    store.put_bytes("runs/r/report.json", b"kept")
    with fleet_records_set_aside([store]):
        assert [i.key for i in store.list("nodes/")] == [] and store.head("ops/drain-ledger.json") is None
        assert store.get_bytes("runs/r/report.json") == b"kept"  # per-run records are not touched
        store.put_bytes("nodes/n3/0002-drained-b.json", b"new")
        store.put_bytes("ops/drain-ledger.json", b"changed")
    assert {i.key: store.get_bytes(i.key) for i in store.list("nodes/")} == {
        "nodes/n2/0001-suspected-a.json": b"old"
    }
    assert store.get_bytes("ops/drain-ledger.json") == before["ops/drain-ledger.json"]


def test_fleet_records_are_restored_when_the_test_fails(tmp_path) -> None:
    store = LocalDirStore(tmp_path)
    store.put_bytes("nodes/n2/0001-suspected-a.json", b"old")
    with pytest.raises(RuntimeError), fleet_records_set_aside([store]):
        store.put_bytes("nodes/n2/0002-replace-x.json", b"new")
        raise RuntimeError("the test failed")
    assert [i.key for i in store.list("nodes/")] == ["nodes/n2/0001-suspected-a.json"]
