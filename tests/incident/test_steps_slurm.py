"""Incident steps against the real four-node Slurm cluster (CLI backend) and a local-directory store:
drain once (a rerun does nothing), a foreign drain is left alone, the diagnosis runs the real replay
probe on the drained node through a MAINT reservation and convicts a (simulated) sick node."""

from __future__ import annotations

import sys

import pytest
from helpers.signed_job import keyed_job, sign_as_job
from longrun.health.ratelimit import DrainPolicy, entries
from longrun.incident import record, runner, step_diagnose, step_drain, steps
from longrun.slurm.factory import make_client

from training.faults import sick_marker
from training.records import schema
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def client(slurm_cluster):
    c = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    yield c
    for n in c.nodes():  # leave the cluster as we found it
        if n.drain_flag:
            if n.is_ours:
                c.resume(n.name)
            elif n.reason == "admin: fan":
                c._run(["scontrol", "update", f"NodeName={n.name}", "State=RESUME"])  # type: ignore[attr-defined]


def incident(tmp_path, client, store, node="n2", run="it1", step=17, nodes=("n1", "n2", "n3")):
    """An incident about a signed alert of a (finished) longrun job of `run` on `nodes` (an alert is
    acted on only when signed by its job and naming a node of the job's allocation)."""
    job_id, key = keyed_job(client, store, run=run, nodelist=nodes, workdir=tmp_path, partition="debug")
    alert = schema.record(
        "alert",
        run=run,
        step=step,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=[node],
        evidence={"world": {"nodes": list(nodes)}},
    )
    return runner.Incident(
        run=run,
        alert_key=f"runs/{run}/alerts/{step:08d}-recompute-r000-1.json",
        alert=sign_as_job(alert, job_id=job_id, key=key),
        job_id=job_id,
        run_params={"run_name": run, "nodes": 3, "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id="test",
    )


def test_drain_once_and_leave_foreign_drains(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    inc = incident(tmp_path, client, store)
    steps.open_record(store, inc)
    first = step_drain.drain(store, client, inc, node="n2", policy=DrainPolicy(max_drains=5))
    again = step_drain.drain(store, client, inc, node="n2", policy=DrainPolicy(max_drains=5))
    assert first["drained_now"] and again["rerun"]
    assert client.node("n2").reason == "longrun:sdc:it1:17"
    assert len(entries(store)) == 1
    rec = record.load(store, run="it1", incident_id=inc.incident_id)
    assert [e["event"] for e in rec["timeline"]] == ["opened", "drained"]

    other = incident(tmp_path, client, store, node="n3", run="it2", step=5, nodes=("n1", "n3", "n4"))
    client._run(["scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=admin: fan"])  # type: ignore[attr-defined]
    steps.open_record(store, other)
    with pytest.raises(runner.IncidentStop, match="someone else"):
        step_drain.drain(store, client, other, node="n3", policy=DrainPolicy(max_drains=5))
    assert client.node("n3").reason == "admin: fan"
    assert len(entries(store)) == 1  # someone else's drain uses no slot


def test_diagnosis_convicts_a_sick_node(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    state_dir = tmp_path / "fault-state"
    marker = sick_marker(state_dir, "n2")
    marker.parent.mkdir(parents=True)
    marker.write_text("drill")
    inc = incident(tmp_path, client, store)
    steps.open_record(store, inc)
    step_drain.drain(store, client, inc, node="n2", policy=DrainPolicy(max_drains=5))
    out = step_diagnose.run_diagnosis(
        store, client, inc, node="n2", run_nodes=("n1", "n3"), state_dir=str(state_dir), python=sys.executable
    )
    assert out["verdict"] == "fail", out["summary"]
    assert out["reference_node"] in ("n1", "n3")
    assert client.node("n2").reason == "longrun:diag-fail:it1:17"
    assert client.reservations() == []
    # A rerun returns the recorded diagnosis and runs nothing.
    assert step_diagnose.run_diagnosis(store, client, inc, node="n2", state_dir=str(state_dir)) == out
    # A healthy node passes, against a fresh isolated reference (a cached one decides nothing alone).
    ok = incident(tmp_path, client, store, node="n3", run="it3", step=9, nodes=("n1", "n3", "n4"))
    steps.open_record(store, ok)
    step_drain.drain(store, client, ok, node="n3", policy=DrainPolicy(max_drains=5))
    out = step_diagnose.run_diagnosis(
        store, client, ok, node="n3", state_dir=str(state_dir), python=sys.executable
    )
    assert out["verdict"] == "pass" and out["reference_from"] == "idle_node", out["summary"]
    assert client.node("n3").reason == "longrun:diag-pass:it3:9"
