"""node_return's selection on the real Slurm cluster (local-directory store, no Airflow): scheduled runs
pick up longrun's diag-pass nodes only when the policy turns auto_return on, and never a diag-fail, a
foreign drain or a repeat offender."""

from __future__ import annotations

import json
import sys

import pytest
from longrun.health import history as h
from longrun.health.policy import NodePolicy
from longrun.nodes import returning
from longrun.slurm.factory import make_client

from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def client(slurm_cluster):
    c = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    yield c
    for n in c.nodes():  # leave the cluster as we found it
        if n.drain_flag and (n.is_ours or n.reason == "admin: fan"):
            c._run(["scontrol", "update", f"NodeName={n.name}", "State=RESUME"])  # type: ignore[attr-defined]


def test_scheduled_selection(tmp_path, client):
    hist = LocalDirStore(tmp_path / "store")
    client.drain("n1", "longrun:diag-pass:sel:3")
    client.drain("n2", "longrun:diag-fail:sel:3")
    client._run(["scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=admin: fan"])  # type: ignore[attr-defined]
    client.drain("n4", "longrun:diag-pass:sel:4")
    for inc in ("a", "b"):
        h.record(hist, "n4", h.SUSPECTED, f"inc-{inc}", run="sel", incident_id=f"inc-{inc}")

    off = returning.select(client, hist, requested=[], policy=NodePolicy(), source="sched.1")
    assert off == {"nodes": [], "refused": {}}
    on = returning.select(client, hist, requested=[], policy=NodePolicy(auto_return=True), source="sched.2")
    assert on["nodes"] == ["n1"] and set(on["refused"]) == {"n4"}  # diag-fail and foreign: not candidates
    assert "repeat offender" in on["refused"]["n4"]
    asked = returning.select(client, hist, requested=["n2"], policy=NodePolicy(), source="op.1")
    assert asked["nodes"] == [] and "diagnostic failed" in asked["refused"]["n2"]
    asked = returning.select(client, hist, requested=["n3"], policy=NodePolicy(), source="op.2")
    assert "someone else" in asked["refused"]["n3"]
    assert [e.kind for e in h.events(hist, "n2")] == [h.RETURN_REFUSED, h.REPLACE]
    assert client.node("n3").reason == "admin: fan"


def test_an_unconfirmed_node_waits_for_an_operator_and_returns_only_on_isolated_rounds(tmp_path, client):
    """`unconfirmed` (docs/security.md, "The diagnosis the suspect cannot touch"): no failed diagnostic,
    no replacement mark, not picked up by the schedule; an operator's node_return probes it in isolation
    (a fresh reference on an idle node, a MAINT reservation each round) and returns it when every round
    passes."""
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    client.drain("n1", "longrun:diag-unconfirmed:unc:3")
    h.record(hist, "n1", h.DIAGNOSED, "inc-u", run="unc", incident_id="inc-u", verdict="unconfirmed")
    scheduled = returning.select(client, hist, requested=[], policy=NodePolicy(auto_return=True), source="s")
    assert "n1" not in scheduled["nodes"] and "n1" not in scheduled["refused"]
    asked = returning.select(client, hist, requested=["n1"], policy=NodePolicy(), source="op.u")
    assert asked == {"nodes": ["n1"], "refused": {}}
    probed = returning.probe(
        store, hist, client, node="n1", repeats=1, source="op.u", partition="p", python=sys.executable
    )
    assert probed["clean"] is True, probed
    assert json.loads(store.get_bytes("ops/probe-reference/p.json"))["computed"]["how"] == "isolated"
    out = returning.resume(client, hist, probed=probed, source="op.u", act=True, policy=NodePolicy())
    assert out["returned"] is True, out
    assert not client.node("n1").drain_flag
    assert h.REPLACE not in [e.kind for e in h.events(hist, "n1")]
