"""Attribution: one node from clean evidence; ambiguous (suspect software) otherwise."""

from __future__ import annotations

import pytest
from longrun.incident import runbooks
from longrun.incident.attribution import AMBIGUOUS, NODE, AttributionOutcome, attribute

from training.records import schema


def alert(**over):
    fields = dict(
        run="r1",
        step=17,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"nodes": ["n1", "n2", "n3"]},
    )
    fields.update(over)
    return schema.record("alert", **fields)


def test_one_node_named_by_a_majority():
    a = attribute(alert())
    assert (a.verdict, a.node, a.ranks) == (NODE, "n2", (1,))
    assert a.runbook == runbooks.RECOMPUTE_MISMATCH
    assert "n2" in a.reason


@pytest.mark.parametrize("check", ["finite", "recompute", "weight_vote"])
def test_runbook_follows_the_check(check):
    assert attribute(alert(check=check)).runbook == runbooks.FOR_CHECK[check]


def test_ranks_on_one_node_count_once():
    a = attribute(alert(suspect_ranks=[2, 3], suspect_nodes=["n2", "n2"], evidence={}))
    assert (a.verdict, a.node, a.ranks) == (NODE, "n2", (2, 3))


def test_rank_only_evidence_is_mapped_through_the_world():
    a = attribute(alert(suspect_nodes=[], suspect_ranks=[2], evidence={"rank_nodes": ["n1", "n2", "n4"]}))
    assert (a.verdict, a.node) == (NODE, "n4")


def test_several_nodes_at_once_is_ambiguous():
    a = attribute(alert(suspect_ranks=[0, 2], suspect_nodes=["n1", "n3"]))
    assert a.verdict == AMBIGUOUS and a.node is None
    assert "several nodes" in a.reason
    assert a.runbook == runbooks.AMBIGUOUS_EVIDENCE


def test_every_replica_disagreeing_is_ambiguous():
    a = attribute(alert(suspect_nodes=["n2"], evidence={"no_majority": True}))
    assert a.verdict == AMBIGUOUS and "every replica disagrees" in a.reason


def test_every_node_of_the_run_named_is_ambiguous():
    a = attribute(alert(suspect_ranks=[0, 1], suspect_nodes=["n1", "n2"], evidence={"nodes": ["n1", "n2"]}))
    assert a.verdict == AMBIGUOUS


def test_no_node_named_is_ambiguous():
    # Two nodes: a recompute mismatch cannot say which one is wrong.
    a = attribute(alert(suspect_ranks=[], suspect_nodes=[], evidence={"nodes": ["n1", "n2"]}))
    assert a.verdict == AMBIGUOUS and "names no node" in a.reason


def test_not_an_alert_is_refused():
    with pytest.raises(schema.SchemaError, match="lacks field"):
        attribute({"schema_version": 1, "kind": "alert", "run": "r", "step": 1, "check": "finite"})


def test_attribution_checks_its_own_fields():
    with pytest.raises(ValueError, match="verdict='maybe'"):
        AttributionOutcome(verdict="maybe", node=None, ranks=(), reason="", runbook="")
    with pytest.raises(ValueError, match="node=None"):
        AttributionOutcome(verdict=NODE, node=None, ranks=(), reason="", runbook="")
    d = attribute(alert()).to_dict()
    assert d["verdict"] == NODE and d["ranks"] == [1]


def test_trainer_shaped_evidence():
    # The shapes training.verdict / training.checks write: world nodes nested, attributable flags.
    world = {"world": {"world_size": 3, "nodes": ["n1", "n2", "n3"]}}
    a = attribute(alert(suspect_nodes=[], suspect_ranks=[2], evidence=world))
    assert (a.verdict, a.node) == (NODE, "n3")
    a = attribute(
        alert(
            suspect_nodes=[],
            suspect_ranks=[],
            evidence={**world, "attributable": False, "why_unnamed": "2 node(s)"},
        )
    )
    assert a.verdict == AMBIGUOUS and "2 node(s)" in a.reason
    a = attribute(
        alert(
            check="weight_vote",
            suspect_nodes=["n1", "n2", "n3"],
            suspect_ranks=[0, 1, 2],
            evidence={**world, "majority": None},
        )
    )
    assert a.verdict == AMBIGUOUS and "no strict majority" in a.reason


def sharded_vote(shards):
    """The evidence a weight vote within replica groups writes (training.checks.weight_vote): no whole-model
    majority, one entry per shard whose holders disagreed (3 x 2 HSDP: shard 0 on ranks 0, 2, 4)."""
    return alert(
        check="weight_vote",
        suspect_ranks=[4],
        suspect_nodes=["n3"],
        evidence={"majority": None, "layout": "2 shard(s) x 3 replica(s) over 6 rank(s)", "shards": shards},
    )


def test_a_sharded_vote_with_a_majority_in_every_disagreeing_shard_names_the_node():
    a = attribute(sharded_vote({"0": {"ranks": [0, 2, 4], "majority": "00ab", "dissent": [4]}}))
    assert (a.verdict, a.node, a.ranks) == (NODE, "n3", (4,))


@pytest.mark.parametrize(
    "shards",
    [
        {
            "0": {"ranks": [0, 2, 4], "majority": "00ab", "dissent": [4]},
            "1": {"ranks": [1, 3, 5], "majority": None},
        },
        {},
        [],
        "0",
        {"0": "not an object"},
    ],
)
def test_a_sharded_vote_without_a_majority_or_unreadable_is_ambiguous(shards):
    a = attribute(sharded_vote(shards))
    assert a.verdict == AMBIGUOUS and "no strict majority" in a.reason
