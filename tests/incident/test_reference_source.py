"""The reservation path's probe reference on the real four-node cluster (issue 14: a retried diagnose
found every healthy node held by the relaunch and gave no verdict; issue 28: the reference can be
poisoned).

- The relaunch holds every healthy node: the reference is taken as a step of the relaunch (`srun
  --jobid --overlap`); the relaunch keeps running, untouched. That reference is in-job: it is not
  cached, and the sick node's fail against it stays unconfirmed (no node for a fresh isolated one).
- No reference anywhere, no idle node, no job of the incident: the step stops loudly with the runbook and
  the node keeps its SDC drain.
- Attack: a forged cached reference (the sick node's own fingerprint, in the right environment, which the
  form checks cannot tell from a real one) or a garbled one never passes a sick node: a fresh isolated
  reference decides, and against a stored one a pass stays unconfirmed.
- Attack (or decay): a cached reference that is wrong (computed in isolation, but on a node that was
  sick then) never convicts a healthy node: a fail counts only against a fresh isolated reference, and
  without one it stays unconfirmed, with no replacement mark.

Real parts: Slurm (sbatch, srun --jobid, MAINT reservations, drains), the replay probe, node_check, a signed
alert, a local store. Nothing is mocked; DCGM is absent here (no GPU), so the probe carries the verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers.signed_job import keyed_job, sign_as_job
from helpers.tracked_client import tracked_client
from longrun.health import history as h
from longrun.health.ratelimit import DrainPolicy
from longrun.incident import (
    record,
    reference_source,
    runbooks,
    runner,
    step_diagnose,
    step_drain,
    step_relaunch,
    steps,
)
from longrun.slurm import ops
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from longrun.tasks import node_history

from training.faults import sick_marker
from training.records import schema
from training.store.interface import NotFound
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SUSPECT = "n2"
OTHERS = ("n1", "n3", "n4")
REF_KEY = "ops/probe-reference/debug.json"


@pytest.fixture
def client(slurm_cluster) -> Iterator:
    with tracked_client(slurm_cluster.env["SLURM_CONF"]) as c:  # our jobs gone, our drains resumed
        yield c
    for r in c.reservations():  # then no reservation of longrun's left
        if r.startswith("longrun_"):
            c.delete_reservation(r)


def incident(tmp_path, client, store, *, run: str) -> runner.Incident:
    """An incident about a signed alert of a (finished) longrun job of `run` naming SUSPECT, drained."""
    nodes = (SUSPECT, *OTHERS[:2])
    job_id, key = keyed_job(client, store, run=run, nodelist=nodes, workdir=tmp_path, partition="debug")
    alert = schema.record(
        "alert", run=run, step=17, check="recompute", suspect_ranks=[1], suspect_nodes=[SUSPECT],
        evidence={"world": {"nodes": list(nodes)}},
    )  # fmt: skip
    inc = runner.Incident(
        run=run, alert_key=f"runs/{run}/alerts/00000017-recompute-r000-1.json",
        alert=sign_as_job(alert, job_id=job_id, key=key), job_id=job_id,
        run_params={"run_name": run, "nodes": 3, "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id=f"test_{run}",
    )  # fmt: skip
    steps.open_record(store, inc)
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    return inc


def hold_others(tmp_path, client, *, tag: str, name: str = "holder") -> int:
    """A running job on every node but the suspect (as the relaunch holds them), tagged `tag`."""
    spec = JobSpec(
        name=name, partition="debug", comment=tag, nodes=len(OTHERS), nodelist=OTHERS, gpus_per_node=0,
        exclusive=False, time_limit_min=10, workdir=str(tmp_path), output=f"{tmp_path}/slurm-%j.out",
        command=("sleep 600",),
    )  # fmt: skip
    job_id = client.submit(spec)
    client.test_jobs.append(job_id)
    ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
    return job_id


def sick(tmp_path) -> str:
    state_dir = tmp_path / "fault-state"
    marker = sick_marker(state_dir, SUSPECT)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("drill")
    return str(state_dir)


def diagnose(store, client, inc, state_dir):
    return step_diagnose.run_diagnosis(
        store, client, inc, node=SUSPECT, run_nodes=OTHERS[:2], state_dir=state_dir, python=sys.executable,
        partition="debug",
    )  # fmt: skip


def isolated(ref: dict, node: str) -> dict:
    """`ref` as the cache holds a reference computed in isolation (probe_reference.isolated_mark): what
    only the orchestrator writes there, so only a forgery or a stale entry can be wrong."""
    return {**ref, "node": node, "computed": {"how": "isolated", "node": node, "reservation": f"r_{node}"}}


def test_a_retry_gets_its_reference_from_the_relaunch_but_neither_caches_nor_convicts_on_it(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    state_dir = sick(tmp_path)
    inc = incident(tmp_path, client, store, run="rs1")
    relaunch_tag = JobTag(dag_id="sdc_incident", run_id=inc.dag_run_id, task_id="relaunch").render()
    job_id = hold_others(tmp_path, client, tag=relaunch_tag, name="rs1")
    # as the relaunch step records its job (a job found by its public tag alone is never used)
    record.update(
        store, run="rs1", incident_id=inc.incident_id,
        change=lambda rec: rec.update({step_relaunch.RELAUNCH_JOB_FIELD: job_id}),
    )  # fmt: skip
    assert not [n for n in client.nodes() if n.state == "idle" and not n.drain_flag]  # nothing idle
    out = diagnose(store, client, inc, state_dir)
    assert out["reference_from"] == "running_job" and out["reference_node"] in OTHERS, out
    assert out["details"]["probe"]["verdict"] == "fail"  # the sick node differs from the job's reference
    assert out["verdict"] == "unconfirmed", out["summary"]  # ... and no isolated reference confirms it
    assert "no fresh isolated reference" in out["summary"], out["summary"]
    assert client.node(SUSPECT).reason == "longrun:diag-unconfirmed:rs1:17"
    assert inc.rec(store).reference.extra["computed"]["how"] == "in_job"
    # the relaunch ran on, on the same nodes; its reference is not cached
    job = client.job(job_id)
    assert job.status is JobStatus.RUNNING and set(job.nodes) == set(OTHERS), job.describe()
    with pytest.raises(NotFound):
        store.get_bytes(REF_KEY)
    assert not [r for r in client.reservations() if r.startswith("longrun_")]


def test_no_reference_and_no_node_stops_loudly_and_a_forged_cache_gives_no_pass(
    tmp_path, client, monkeypatch
):
    # The diagnosis waits for a node to free up (REFERENCE_WAIT_S); here none will: no wait.
    monkeypatch.setattr(reference_source, "REFERENCE_WAIT_S", 0.0)
    store = LocalDirStore(tmp_path / "store")
    state_dir = sick(tmp_path)
    inc = incident(tmp_path, client, store, run="rs2")
    hold_others(tmp_path, client, tag="not-this-incident")  # someone else's job holds every healthy node
    with pytest.raises(runner.IncidentStop, match="no healthy idle node") as e:
        diagnose(store, client, inc, state_dir)
    assert runbooks.DIAGNOSTIC_FAILED in str(e.value)
    assert client.node(SUSPECT).reason == "longrun:sdc:rs2:17"
    assert not inc.rec(store).diagnosis
    # Attack, with still no node for a fresh reference: a forged cached reference that is the sick node's
    # own fingerprint, in the right environment. Without the isolation mark it is never read...
    forged = probe_json(SUSPECT, state_dir)
    store.put_bytes(REF_KEY, json.dumps({**forged, "node": "n1"}).encode())
    with pytest.raises(runner.IncidentStop, match="no healthy idle node"):
        diagnose(store, client, inc, state_dir)
    # ... and with it (forged too), node_check matches it; longrun records no pass.
    store.put_bytes(REF_KEY, json.dumps(isolated(forged, "n1")).encode())
    out = diagnose(store, client, inc, state_dir)
    assert out["details"]["probe"]["verdict"] == "pass"  # what the forgery achieved on the node...
    assert out["verdict"] == "unconfirmed", out["summary"]  # ...is no verdict
    assert "not confirmed" in out["summary"] and "no healthy idle node" in out["summary"], out["summary"]
    assert client.node(SUSPECT).reason == "longrun:diag-unconfirmed:rs2:17"


def probe_json(node: str, state_dir: str) -> dict:
    """The replay probe's JSON for `node` here (this machine runs every test node): the sick node's own
    fingerprint, in the environment the nodes report."""
    argv = [sys.executable, "-m", "training.probe", "--node", node, "--state-dir", state_dir]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cached", ["forged", "garbled"])
def test_a_forged_or_garbled_cached_reference_never_passes_a_sick_node(tmp_path, client, cached):
    store = LocalDirStore(tmp_path / "store")
    state_dir = sick(tmp_path)
    inc = incident(tmp_path, client, store, run=f"rs3{cached}")
    forged = isolated(probe_json(SUSPECT, state_dir), "n1")
    store.put_bytes(REF_KEY, json.dumps(forged).encode() if cached == "forged" else b'{"fingerprint": "0')
    out = diagnose(store, client, inc, state_dir)
    assert out["verdict"] == "fail", out["summary"]
    assert client.node(SUSPECT).reason == f"longrun:diag-fail:rs3{cached}:17"
    # an idle node was free: the reference was computed there first, in isolation, and replaced the cache
    assert out["reference_from"] == "idle_node" and out["reference_node"] in OTHERS, out
    cached_now = json.loads(store.get_bytes(REF_KEY))
    assert cached_now["fingerprint"] != forged["fingerprint"] and cached_now["computed"]["how"] == "isolated"
    assert not [r for r in client.reservations() if r.startswith("longrun_")]


@pytest.mark.parametrize("idle", [True, False], ids=["a-node-is-idle", "no-node-is-idle"])
def test_a_fail_against_a_wrong_cached_reference_never_convicts_a_healthy_node(tmp_path, client, idle):
    """Attack (or decay): the partition's cached reference is wrong: marked as computed in isolation, but
    its fingerprint is a sick node's (a reference node that was sick when it computed it, or a forgery).
    Before, a fail against a stored reference was final: every healthy suspect of the partition was
    convicted, drained diag-fail and marked for replacement. Now a fail counts only against a fresh
    isolated reference: with an idle node that one is computed, first, and the healthy node passes (the
    cache is replaced); with none, the fail against the cached one stays unconfirmed, and the node is
    drained for a person with no failed diagnostic and no replacement mark."""
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    stale_state = tmp_path / "stale"
    marker = sick_marker(stale_state, "n1")
    marker.parent.mkdir(parents=True)
    marker.write_text("drill")
    wrong = isolated(probe_json("n1", str(stale_state)), "n1")  # n1's fingerprint when it was sick
    store.put_bytes(REF_KEY, json.dumps(wrong).encode())
    run = f"rs4{'i' if idle else 'n'}"
    inc = incident(tmp_path, client, store, run=run)
    if not idle:
        hold_others(tmp_path, client, tag="not-this-incident")
    out = diagnose(store, client, inc, str(tmp_path / "fault-state"))  # no marker: the suspect is healthy
    node_history.after_diagnose(hist, inc, SUSPECT, out)
    evs = h.events(hist, SUSPECT)
    assert "fail" not in [e.verdict for e in evs if e.kind == h.DIAGNOSED], out["summary"]
    assert h.REPLACE not in [e.kind for e in evs]
    assert out["verdict"] == ("pass" if idle else "unconfirmed"), out["summary"]
    assert client.node(SUSPECT).reason == f"longrun:diag-{out['verdict']}:{run}:17"
    if idle:  # the fresh isolated reference decided, and replaced the wrong one in the cache
        assert out["reference_from"] == "idle_node", out
        assert json.loads(store.get_bytes(REF_KEY))["fingerprint"] != wrong["fingerprint"]
    else:  # compared with the wrong one, the node "failed"; nothing isolated could confirm that
        assert out["reference_from"] == "cached" and out["details"]["probe"]["verdict"] == "fail", out
        assert "no fresh isolated reference" in out["summary"], out["summary"]
    assert not [r for r in client.reservations() if r.startswith("longrun_")]
