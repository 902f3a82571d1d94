"""The hot-spare path's diagnosis on the real four-node cluster: the suspect is probed as a step of the
job that still holds it (no MAINT reservation), the reference is taken on a healthy node of the same
allocation, the verdict is recorded as the reservation path records it, and the node leaves the job
drained with the verdict. A step that gives no verdict falls back to the reservation path (the record
says why) after releasing the node; a forged alert probes, drains and releases nothing.

Real parts: Slurm (srun --jobid, scontrol), the replay probe, node_check, the dcgmi JSON parser, a signed
alert, a local store. Mocked: `dcgmi` alone, in its own test. DCGM cannot run here (no GPU, no DCGM host
engine): elsewhere it is absent and the probe carries the verdict, as on every CPU node.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.signed_job import sign_as_job
from helpers.tracked_client import tracked_client
from longrun import alert_auth
from longrun.health import dcgm, probe_reference
from longrun.health.ratelimit import DrainPolicy
from longrun.incident import hot_spare, record, runbooks, runner, step_drain, steps
from longrun.incident.events import Event
from longrun.slurm import ops
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag

from training.faults import sick_marker
from training.records import schema
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES = ("n1", "n2", "n3")  # n1 hosts the batch script; n3 is the suspect
SUSPECT = "n3"


@pytest.fixture
def client(slurm_cluster) -> Iterator:
    with tracked_client(slurm_cluster.env["SLURM_CONF"]) as c:  # our jobs gone, our drains resumed
        yield c
    assert not [r for r in c.reservations() if r.startswith("longrun_")]


def kept_incident(tmp_path, client, store, *, run: str, tamper: bool = False) -> runner.Incident:
    """A running longrun job of `run` on NODES (2 training + 1 spare) and a signed alert naming SUSPECT."""
    tag = JobTag(dag_id="training_run", run_id=f"test__{run}", task_id="submit").render()
    spec = JobSpec(
        name=run, partition="debug", comment=tag, nodes=len(NODES), nodelist=NODES, gpus_per_node=0,
        exclusive=False, time_limit_min=10, workdir=str(tmp_path), output=f"{tmp_path}/slurm-%j.out",
        command=("sleep 600",),
    )  # fmt: skip
    key = alert_auth.issue(store, run=run, tag=tag)
    job_id = client.submit(spec)
    client.test_jobs.append(job_id)
    alert_auth.bind(store, run=run, tag=tag, job_id=job_id)
    ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
    alert = schema.record(
        "alert", run=run, step=17, check="recompute", suspect_ranks=[1], suspect_nodes=[SUSPECT],
        evidence={"world": {"nodes": list(NODES[1:])}},
    )  # fmt: skip
    signed = sign_as_job(alert, job_id=job_id, key=key)
    if tamper:  # the job (hostile) points the orchestrator at another node after signing
        signed = {**signed, "suspect_nodes": ["n2"]}
    params = {"run_name": run, "nodes": 2, "spare_nodes": 1, "gpus_per_node": 0, "incident_mode": "act"}
    inc = runner.Incident(
        run=run, alert_key=f"runs/{run}/alerts/00000017-recompute-r000-1.json", alert=signed,
        job_id=job_id, run_params=params, dag_run_id="test",
    )  # fmt: skip
    steps.open_record(store, inc)
    return inc


def test_a_sick_node_is_convicted_inside_the_job_and_released(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    state_dir = tmp_path / "fault-state"
    marker = sick_marker(state_dir, SUSPECT)
    marker.parent.mkdir(parents=True)
    marker.write_text("drill")
    inc = kept_incident(tmp_path, client, store, run="inj1")
    assert hot_spare.freeze_kept(store, client, inc) is not None  # the job stays
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    out = hot_spare.diagnose_in_job(
        store, client, inc, node=SUSPECT, partition="debug", state_dir=str(state_dir), python=sys.executable
    )
    assert out is not None and out["verdict"] == "fail", out
    assert out["where"] == "in_job" and out["reference_node"] in NODES[:2]
    # the verdict as the reservation path records it
    rec = record.load(store, run=inc.run, incident_id=inc.incident_id)
    assert rec["diagnosis"] == out and rec["reference"]["fingerprint"]
    assert rec["diagnosis"]["reason"] == "longrun:diag-fail:inj1:17"
    events = [e["event"] for e in rec["timeline"]]
    assert {"reference", "diagnosed", "released"} <= set(events)
    assert Event.DIAGNOSIS_IN_JOB_SKIPPED not in events
    # released from the job, which keeps running on the rest; the node stays drained with the verdict
    job = client.job(inc.job_id)
    assert job.status is JobStatus.RUNNING and job.nodes == NODES[:2], job.describe()
    node = client.node(SUSPECT)
    assert node.drain_flag and node.reason == "longrun:diag-fail:inj1:17"
    assert not client.reservations()  # no MAINT reservation on this path
    # a rerun returns the recorded verdict and runs nothing
    assert hot_spare.diagnose_in_job(store, client, inc, node=SUSPECT, partition="debug") == out
    print(f"\nIN-JOB DIAGNOSIS: node_check step {out['duration_s']} s; reference + node_check + drain "
          f"{out['total_s']} s; then released")  # fmt: skip


def test_no_verdict_from_the_step_falls_back_after_releasing_the_node(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    inc = kept_incident(tmp_path, client, store, run="inj2")
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    ref = {"node": "n1", "verdict": "no-reference", "fingerprint": "0123456789abcdef", "torch": "2.0",
           "cpu_capability": "DEFAULT", "threads": 1}  # fmt: skip
    probe_reference.remember_reference(store, "debug", ref)  # a usable cached reference: no reference step
    # a step that cannot run the diagnostic (no interpreter there): no verdict, so no conviction
    out = hot_spare.diagnose_in_job(store, client, inc, node=SUSPECT, partition="debug", python="/bin/false")
    assert out is None
    rec = inc.rec(store)
    skipped = rec.event(Event.DIAGNOSIS_IN_JOB_SKIPPED)
    assert skipped and "no verdict" in skipped.details["why"] and "reservation" in skipped.details["fallback"]
    assert not rec.diagnosis
    # the node left the job (the reservation's diagnostic can start there) and kept its SDC drain
    assert SUSPECT not in client.job(inc.job_id).nodes
    node = client.node(SUSPECT)
    assert node.drain_flag and node.reason == "longrun:sdc:inj2:17"


def test_a_forged_alert_probes_and_releases_nothing(tmp_path, client):
    """Attack: the job signs an alert, then rewrites its suspect. Without the gate the orchestrator would
    probe a node, re-drain it with a verdict and shrink the job on the job's word."""
    store = LocalDirStore(tmp_path / "store")
    inc = kept_incident(tmp_path, client, store, run="inj3", tamper=True)
    client.drain("n2", "longrun:sdc:inj3:17")  # as if drained already: the gate is the only guard left
    with pytest.raises(runner.IncidentStop, match="not acted on"):
        hot_spare.diagnose_in_job(store, client, inc, node="n2", partition="debug", python=sys.executable)
    assert client.job(inc.job_id).nodes == NODES
    assert client.node("n2").reason == "longrun:sdc:inj3:17"
    rec = inc.rec(store)
    assert not rec.diagnosis and not record.has_event(rec, Event.RELEASED)


DATA = Path(__file__).parent / "data"
FAKE_DCGMI = """#!/bin/sh
# stands in for NVIDIA's dcgmi (no GPU, no DCGM here): records its arguments, prints a dcgmi diag -j document
printf '%s\\n' "$*" >> '{calls}'
cat '{doc}'
exit {rc}
"""


@pytest.mark.parametrize(
    ("doc", "verdict"), [("dcgmi_diag_r3_fail.json", "fail"), ("dcgmi_diag_r2_pass.json", "pass")]
)
def test_dcgmi_on_the_step_path_decides_the_verdict(tmp_path, client, monkeypatch, doc, verdict):
    """DCGM cannot run here (no GPU, no DCGM host engine), so a fake `dcgmi` executable prints a
    hand-written `dcgmi diag -j` document (tests/incident/data). It is found the way the real one is, with
    no hook in the code: node_check looks `dcgmi` up on its PATH, and the step takes PATH from the
    orchestrator's environment (`srun --export`'s allow-list), so the fake's folder goes first on this
    process's PATH. The node is healthy (no sick marker: the probe passes), so DCGM's result alone decides
    the verdict: the failing document convicts the node, the passing one leaves it diag-pass."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "dcgmi-calls"
    fake = bin_dir / "dcgmi"
    # the exit code is not what decides: node_check parses the JSON
    fake.write_text(FAKE_DCGMI.format(calls=calls, doc=DATA / doc, rc=0 if verdict == "pass" else 1))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    store = LocalDirStore(tmp_path / "store")
    run = f"dcgm{verdict}"
    inc = kept_incident(tmp_path, client, store, run=run)
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    out = hot_spare.diagnose_in_job(
        store, client, inc, node=SUSPECT, partition="debug", state_dir=str(tmp_path / "no-faults"),
        python=sys.executable,
    )  # fmt: skip
    assert out is not None and out["where"] == "in_job", out
    # dcgmi ran once, in the step on the suspect, at the level a recompute alert calls for
    assert calls.read_text().splitlines() == ["diag -r 3 -j"]
    rec = record.load(store, run=run, incident_id=inc.incident_id)
    diag = rec["diagnosis"]
    assert diag == out and diag["dcgm_level"] == 3
    assert diag["details"]["probe"]["verdict"] == "pass", diag["details"]["probe"]
    seen = diag["details"]["dcgm"]
    assert seen is not None and seen["level"] == 3, diag["details"]
    assert diag["verdict"] == verdict, diag["summary"]
    assert diag["reason"] == f"longrun:diag-{verdict}:{run}:17"
    # the record's one line names DCGM's result: the failing test and GPU, or the results that passed
    if verdict == "fail":
        assert seen["passed"] is False and seen["version"] == "3.3.5"
        failed = [(f["category"], f["test"], f["gpu"]) for f in seen["failures"] if f["status"] == "fail"]
        assert failed == [("Hardware", "Diagnostic", "3")], seen
        assert "; dcgmi diag -r 3: FAILED Diagnostic@gpu3;" in diag["summary"], diag["summary"]
        assert diag["runbook"] == runbooks.DIAGNOSTIC_FAILED
    else:
        assert seen["passed"] is True and not seen["failures"] and seen["version"] == "4.1.0"
        line = f"; dcgmi diag -r 3: passed ({seen['tests_run']} results);"
        assert seen["tests_run"] > 0 and line in diag["summary"], diag["summary"]
        assert diag["runbook"] == runbooks.DIAGNOSTIC_PASSED
    assert dcgm.describe(seen) in diag["summary"] and "dcgmi absent" not in diag["summary"]
    # the node left the job, drained with the verdict DCGM's result decided
    assert SUSPECT not in client.job(inc.job_id).nodes
    node = client.node(SUSPECT)
    assert node.drain_flag and node.reason == diag["reason"]
