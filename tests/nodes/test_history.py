"""Node history records, the repeat-offender policy and `longrun nodes`, on a local-directory store."""

from __future__ import annotations

import json

import pytest
from longrun.cli import main as longrun_main
from longrun.health import history as h
from longrun.health.policy import NodePolicy, standing

from training.records.schema import SchemaError
from training.store.local import LocalDirStore

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


# Node events as the code before the shared record readers wrote them (append: json.dumps, sorted keys).
OLD_EVENTS = {
    "nodes/n2/1764493964750-diagnosed-inc-20261130-abc.json": (
        b'{"evidence": {"dcgm_level": 2, "expected": "cd34", "fingerprint": "ab12"},'
        b' "incident_id": "inc-20261130-abc", "kind": "diagnosed", "node": "n2", "reason": "longrun:sdc:r1:40",'
        b' "run": "r1", "schema_version": 1, "source": "inc-20261130-abc", "time": 1764493964.75, "verdict": "fail"}'
    ),
    "nodes/n2/1764493970000-returned-node_return.manual__1.json": (
        b'{"evidence": {}, "incident_id": null, "kind": "returned", "node": "n2", "reason": null, "run": null,'
        b' "schema_version": 1, "source": "node_return.manual__1", "time": 1764493970.0, "verdict": null}'
    ),
}


def test_events_written_before_still_read_and_are_written_the_same(store):
    for key, data in OLD_EVENTS.items():
        store.put_bytes(key, data)
    evs = h.events(store, "n2")
    assert evs == [
        h.NodeEvent(
            node="n2", kind=h.DIAGNOSED, time=1764493964.75, source="inc-20261130-abc", run="r1",
            incident_id="inc-20261130-abc", verdict="fail", reason="longrun:sdc:r1:40",
            evidence={"dcgm_level": 2, "expected": "cd34", "fingerprint": "ab12"},
        ),
        h.NodeEvent(node="n2", kind=h.RETURNED, time=1764493970.0, source="node_return.manual__1"),
    ]  # fmt: skip
    for ev, (key, data) in zip(evs, OLD_EVENTS.items(), strict=True):
        assert ev.key == key and json.dumps(ev.to_json(), sort_keys=True).encode() == data
    assert h.state(evs) == "returned"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema_version": None}, "'schema_version'"),
        ({"schema_version": 2}, "'schema_version'"),
        ({"node": None}, "'node'"),
        ({"node": "ALL"}, "'node'"),
        ({"kind": None}, "'kind'"),
        ({"kind": "node_event"}, "'kind'"),
        ({"time": None}, "'time'"),
        ({"time": "yesterday"}, "'time'"),
        ({"time": 0}, "'time'"),
        ({"source": None}, "'source'"),
        ({"source": "../x"}, "'source'"),
        ({"run": 7}, "'run'"),
        ({"incident_id": ["i1"]}, "'incident_id'"),
        ({"verdict": "maybe"}, "'verdict'"),
        ({"reason": False}, "'reason'"),
        ({"evidence": "ok"}, "'evidence'"),
        ({"note": "x"}, "unknown field.*'note'"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_field(store, change, field):
    obj = {
        k: v for k, v in {**json.loads(next(iter(OLD_EVENTS.values()))), **change}.items() if v is not None
    }
    with pytest.raises(SchemaError, match=field):
        h.NodeEvent.from_json(obj)
    key = "nodes/n2/1764493964750-diagnosed-inc-20261130-abc.json"
    store.put_bytes(key, json.dumps(obj).encode())
    with pytest.raises(ValueError, match=f"{key}: .*{field}"):  # events() names the key
        h.events(store, "n2")
    assert h.safe_events(store, "n2")[0] == []  # pages and logs catch the ValueError


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


def test_the_return_probe_suite_follows_the_last_suspicion_as_recorded():
    from longrun.nodes.returning import dcgm_level

    def suspected(evidence: dict, t: float = 1.0) -> h.NodeEvent:
        return h.NodeEvent(node="n2", kind=h.SUSPECTED, time=t, source=f"inc-{t}", evidence=evidence)

    finite = {"check": "finite", "step": 7, "suspect_ranks": [1], "verdict": "hardware"}  # as recorded
    assert dcgm_level([]) == 3
    assert dcgm_level([suspected(finite)]) == 2
    assert dcgm_level([suspected({**finite, "check": "recompute"})]) == 3
    assert dcgm_level([suspected({"check": 5}), suspected(finite, 2.0)]) == 4  # suspected before
    assert dcgm_level([suspected({"step": 7})]) == 3 and dcgm_level([suspected({"check": 5})]) == 3


def test_a_timeline_line_shows_the_probe_fingerprints_a_diagnosed_event_keeps():
    from longrun.health.cli import timeline_line

    def diagnosed(evidence: dict) -> h.NodeEvent:
        return h.NodeEvent(
            node="n2", kind=h.DIAGNOSED, time=1.0, source="s", verdict="fail", evidence=evidence
        )

    kept = {
        "summary": "fail",
        "probe_verdict": "fail",
        "fingerprint": "ab12",
        "expected": "cd34",
        "probe_env": {},
    }
    assert timeline_line(diagnosed(kept)).endswith("fingerprint=ab12 expected=cd34")
    assert timeline_line(diagnosed({"fingerprint": "ab12"})).endswith("fingerprint=ab12 expected=None")
    odd = timeline_line(diagnosed({"fingerprint": "ab12", "expected": 5, "threads": "x"}))  # never fails
    assert odd.endswith("fingerprint=ab12 expected=None")
    assert "fingerprint" not in timeline_line(diagnosed({"fingerprint": 7}))
    assert "fingerprint" not in timeline_line(diagnosed({}))
