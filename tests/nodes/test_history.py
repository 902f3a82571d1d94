"""Node history records, the repeat-offender policy and `longrun nodes`, on a local-directory store."""

from __future__ import annotations

import json

import pytest
from longrun.cli import main as longrun_main
from longrun.nodes import history as h
from longrun.nodes.policy import NodePolicy, standing

from training.store import LocalDirStore

DAY = 86400.0


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGRUN_STORE_DIR", str(tmp_path / "store"))
    for k in ("AWS_ENDPOINT_URL", "LONGRUN_BUCKET"):
        monkeypatch.delenv(k, raising=False)
    return LocalDirStore(tmp_path / "store")


def ev(kind, t, source="inc1", **kw):
    return h.NodeEvent(node="n2", kind=kind, time=t, source=source, **kw)


def test_round_trip_and_validation():
    e = ev(h.DIAGNOSED, 1.7e9, verdict="fail", evidence={"fingerprint": "ab"})
    assert h.NodeEvent.from_json(json.loads(json.dumps(e.to_json()))) == e
    bad = e.to_json()
    for field, value in (("verdict", "maybe"), ("kind", "fixed"), ("node", "n[1-4]"), ("schema_version", 9)):
        with pytest.raises(ValueError, match=field):
            h.NodeEvent.from_json({**bad, field: value})
    with pytest.raises(ValueError, match="source"):
        h.NodeEvent.from_json({**bad, "source": "../x"})
    with pytest.raises(ValueError, match="unknown"):
        h.NodeEvent.from_json({**bad, "extra": 1})
    with pytest.raises(ValueError, match="time"):
        h.NodeEvent.from_json({k: v for k, v in bad.items() if k != "time"})


def test_append_is_idempotent_per_source_and_kind(store):
    first = h.record(store, "n2", h.SUSPECTED, "inc1", run="r")
    again = h.record(store, "n2", h.SUSPECTED, "inc1", run="r")  # a retried task
    h.record(store, "n2", h.DRAINED, "inc1", run="r", reason="longrun:sdc:r:5")
    assert again == first
    assert [e.kind for e in h.events(store, "n2")] == [h.SUSPECTED, h.DRAINED]
    assert h.nodes(store) == ["n2"]
    assert h.state(h.events(store, "n2")) == h.DRAINED


def test_a_bad_record_is_named(store):
    store.put_bytes("nodes/n2/0000000000001-suspected-x.json", b'{"node": "n2"}')
    with pytest.raises(ValueError, match="nodes/n2/0000000000001-suspected-x.json"):
        h.events(store, "n2")


def test_repeat_offender_rules():
    now = 100 * DAY
    p = NodePolicy(window_s=30 * DAY, max_suspicions=2)
    once = [ev(h.SUSPECTED, now - DAY)]
    assert not standing("n2", once, p, now=now).repeat_offender
    old_and_new = [ev(h.SUSPECTED, now - 60 * DAY, "old"), ev(h.SUSPECTED, now - DAY, "new")]
    assert not standing("n2", old_and_new, p, now=now).repeat_offender  # outside the window
    twice = [ev(h.SUSPECTED, now - 5 * DAY, "a"), ev(h.SUSPECTED, now - DAY, "b")]
    s = standing("n2", twice, p, now=now)
    assert s.repeat_offender and "suspected 2 times" in s.why
    failed = [ev(h.DIAGNOSED, now - 90 * DAY, verdict="fail")]
    assert standing("n2", failed, p, now=now).repeat_offender  # a failure counts whatever its age
    returned = [*failed, ev(h.RETURNED, now - 80 * DAY, "by-hand")]
    assert not standing("n2", returned, p, now=now).repeat_offender  # a person returned it after
    with pytest.raises(ValueError, match="max_suspicions"):
        NodePolicy.from_json({"max_suspicions": 0})
    with pytest.raises(ValueError, match="unknown"):
        NodePolicy.from_json({"max_suspicion": 2})


def test_cli_list_and_show(store, capsys):
    assert longrun_main(["nodes", "list"]) == 1
    h.record(store, "n2", h.SUSPECTED, "inc1", run="r", incident_id="inc1", evidence={"check": "recompute"})
    h.record(
        store,
        "n2",
        h.DIAGNOSED,
        "inc1",
        run="r",
        verdict="pass",
        evidence={"fingerprint": "ab", "expected": "ab"},
    )
    capsys.readouterr()
    assert longrun_main(["nodes", "list"]) == 0
    assert "n2  state=diag-pass  events=2" in capsys.readouterr().out
    assert longrun_main(["nodes", "show", "n2"]) == 0
    out = capsys.readouterr().out
    assert "suspected" in out and "fingerprint=ab" in out and "incident=inc1" in out
    assert longrun_main(["nodes", "show", "n2", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["suspected", "diagnosed"]
    assert longrun_main(["nodes", "show", "n3"]) == 1
    assert longrun_main(["nodes", "show", "bad[node]"]) == 2
