"""node_return's per-node XCom objects as records (`longrun.nodes.outcome`): every shape the tasks have
passed reads and writes back the same JSON, key order included; a malformed one is refused naming the
field. Pure Python: no Slurm, no Airflow."""

from __future__ import annotations

import json

import pytest
from longrun.nodes.outcome import NodeProbe, NodeReturn

from training.records.schema import SchemaError

#: As probe_task / returning.probe wrote them before the records had a type.
PROBES = [
    '{"node": "n3", "clean": true, "rounds": [], "observe": true}',
    '{"node": "n3", "clean": false, "rounds": [], "why": "no healthy node for a reference"}',
    '{"node": "n3", "clean": true, "rounds": [{"round": 1, "verdict": "pass", "summary": "ok", "reason": null}],'
    ' "dcgm_level": 2}',
]
#: As returning.resume wrote them.
RETURNS = [
    '{"node": "n3", "returned": true}',
    '{"node": "n3", "returned": false, "why": "not every round passed: [\'fail\']"}',
    '{"node": "n3", "returned": false, "observe": true}',
]


@pytest.mark.parametrize("text", PROBES)
def test_a_probe_as_written_before_reads_and_writes_back_the_same(text: str) -> None:
    p = NodeProbe.from_json(json.loads(text))
    assert p.node == "n3"
    assert json.dumps(p.to_json()) == text


@pytest.mark.parametrize("text", RETURNS)
def test_a_return_as_written_before_reads_and_writes_back_the_same(text: str) -> None:
    r = NodeReturn.from_json(json.loads(text))
    assert r.node == "n3"
    assert json.dumps(r.to_json()) == text


def test_the_fields_read_as_attributes() -> None:
    observe, failed, probed = (NodeProbe.from_json(json.loads(t)) for t in PROBES)
    assert (observe.clean, observe.observe, observe.rounds) == (True, True, ())
    assert (failed.clean, failed.why) == (False, "no healthy node for a reference")
    assert (probed.dcgm_level, [r["verdict"] for r in probed.rounds]) == (2, ["pass"])
    returned, refused, would = (NodeReturn.from_json(json.loads(t)) for t in RETURNS)
    assert (returned.returned, refused.returned, refused.why, would.observe) == (
        True,
        False,
        refused.why,
        True,
    )
    assert NodeProbe.from_json({"node": "n1", "clean": True, "note": 1}).to_json()["note"] == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"node": None}, "'node'"),
        ({"node": 3}, "'node'"),
        ({"clean": "yes"}, "'clean'"),
        ({"rounds": "pass"}, "'rounds'"),
        ({"rounds": ["pass"]}, "'rounds'"),
        ({"why": 5}, "'why'"),
        ({"dcgm_level": "2"}, "'dcgm_level'"),
        ({"observe": 1}, "'observe'"),
    ],
)
def test_a_malformed_probe_is_refused_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(SchemaError, match=field):
        NodeProbe.from_json({**json.loads(PROBES[2]), **change})


@pytest.mark.parametrize(
    ("change", "field"),
    [({"node": None}, "'node'"), ({"returned": "no"}, "'returned'"), ({"why": ["x"]}, "'why'")],
)
def test_a_malformed_return_is_refused_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(SchemaError, match=field):
        NodeReturn.from_json({**json.loads(RETURNS[1]), **change})
    with pytest.raises(SchemaError, match="JSON object"):
        NodeReturn.from_json(["n3"])


def test_the_writers_write_what_they_wrote_before() -> None:
    """The tasks build these with keyword arguments (returning.probe/resume, longrun.tasks.node_return.probe_task): the JSON
    is the one they wrote as plain dicts, key order included."""
    rounds = ({"round": 1, "verdict": "pass", "summary": "ok", "reason": None},)
    written = [
        NodeProbe(node="n3", clean=True, observe=True),
        NodeProbe(node="n3", clean=False, why="no healthy node for a reference"),
        NodeProbe(node="n3", clean=True, rounds=rounds, dcgm_level=2),
    ]
    assert [json.dumps(p.to_json()) for p in written] == PROBES
    returns = [
        NodeReturn(node="n3", returned=True),
        NodeReturn(node="n3", returned=False, why="not every round passed: ['fail']"),
        NodeReturn(node="n3", returned=False, observe=True),
    ]
    assert [json.dumps(r.to_json()) for r in returns] == RETURNS


def test_a_null_and_an_unknown_field_come_back_where_they_were() -> None:
    text = '{"node": "n3", "clean": false, "rounds": [], "why": null, "dcgm_level": 1, "note": {"a": 1}}'
    p = NodeProbe.from_json(json.loads(text))
    assert (p.why, p.extra) == (None, {"note": {"a": 1}})
    assert json.dumps(p.to_json()) == text
    text = '{"node": "n3", "returned": false, "why": null, "observe": null}'
    assert json.dumps(NodeReturn.from_json(json.loads(text)).to_json()) == text
