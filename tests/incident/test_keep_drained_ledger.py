"""keep_drained's reading of the drain ledger: which nodes the records say longrun drained for an incident.

No Slurm here (`drained_nodes` reads only the store); restoring those nodes on a real cluster is in
test_keep_drained_slurm.py. Each attack writes a malformed entry into the real ledger object, as a
corrupted or tampered ledger would hold it: the rule is that the node stays drained (its time unknown),
never that it is dropped; an entry that names no node is passed over, with a log line.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from longrun.health import ratelimit
from longrun.health.ratelimit import LEDGER_KEY, reserve_drain
from longrun.incident import keep_drained

from training.store.local import LocalDirStore

INC = "00000017-recompute-r000-1700000017"
NOW = 1_800_000_000.0


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def _ledger(store: LocalDirStore, *entries: Any) -> None:
    ledger = {"schema_version": 1, "kind": "drain_ledger", "entries": list(entries)}
    store.put_bytes(LEDGER_KEY, json.dumps(ledger).encode())


def _entry(node: Any = "n2", incident_id: Any = INC, **more: Any) -> dict[str, Any]:
    return {"incident_id": incident_id, "node": node, "run": "r", "time": NOW - 60, **more}


#: A record without a `drained` event: only the ledger says what was drained.
NOT_DRAINED: dict[str, Any] = {"timeline": []}


def test_a_well_formed_grant_of_the_incident_counts_and_others_do_not(store) -> None:
    _ledger(store, _entry("n2"), _entry("n3", incident_id="another"))
    assert keep_drained.drained_nodes(store, NOT_DRAINED, INC) == ("n2",)


@pytest.mark.parametrize("time", ["noon", None, True, [1], float("nan"), "absent"])
def test_an_entry_with_a_malformed_time_keeps_its_node_drained(store, time) -> None:
    entry = _entry("n2", time=time)
    if time == "absent":
        del entry["time"]
    _ledger(store, entry)
    assert keep_drained.LedgerDrain.read(entry).time is None  # the time is unknown, the node is not
    assert keep_drained.drained_nodes(store, NOT_DRAINED, INC) == ("n2",)


def test_an_entry_the_rate_limit_quarantined_keeps_its_node_drained(store) -> None:
    # Another incident's drain moves the malformed entry out of `entries` (into `quarantined`); the node
    # this incident drained must not return to service because of that.
    _ledger(store, _entry("n2", time="noon"))
    reserve_drain(store, incident_id="another", node="n3", run="r2", now=NOW)
    assert [e["node"] for e in ratelimit.entries(store)] == ["n3"]
    assert ratelimit.quarantined(store) == [_entry("n2", time="noon")]
    assert keep_drained.drained_nodes(store, NOT_DRAINED, INC) == ("n2",)


@pytest.mark.parametrize(
    "entry",
    [
        ["n2"],
        "n2",
        None,
        _entry(node=None),
        _entry(node=7, time="noon"),
        _entry(incident_id=None),
        _entry(incident_id=7),
    ],
    ids=["list", "string", "null", "no-node", "bad-node", "no-incident", "bad-incident"],
)
def test_an_entry_naming_no_node_of_the_incident_is_passed_over_and_logged(store, caplog, entry) -> None:
    _ledger(store, entry, _entry("n4"))
    with caplog.at_level(logging.WARNING, logger="longrun.sdc_incident"):
        assert keep_drained.drained_nodes(store, NOT_DRAINED, INC) == ("n4",)
    assert "does not read" in caplog.text and "passed over" in caplog.text


def test_an_unreadable_entry_of_another_incident_is_not_ours(store, caplog) -> None:
    _ledger(store, _entry("n3", incident_id="another", time="noon"))
    with caplog.at_level(logging.WARNING, logger="longrun.sdc_incident"):
        assert keep_drained.drained_nodes(store, NOT_DRAINED, INC) == ()
    assert caplog.text == ""


def test_the_record_drain_and_the_ledger_are_merged_once(store) -> None:
    rec = {"timeline": [{"event": "drained", "time": NOW}], "drain": {"node": "n2"}}
    _ledger(store, _entry("n2", time="noon"), _entry("n5"))
    assert keep_drained.drained_nodes(store, rec, INC) == ("n2", "n5")
