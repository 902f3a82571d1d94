"""The hot-spare path's diagnosis on the real four-node cluster: the suspect is probed as a step of the
job that still holds it (no MAINT reservation), the reference taken on a healthy node of the same
allocation; what that says is evidence only (`diagnosed_in_job`). The node then leaves the job and the
reservation path decides in isolation, against a reference on an idle node outside the job; only that
verdict reaches the record's `diagnosis` and the node's history. A step that gives no verdict falls back
to the reservation path (the record says why) after releasing the node; a forged alert probes, drains and
releases nothing.

Attacks (the kept job interferes with the steps that run inside its allocation): a reference it poisons
is never cached and convicts no later suspect; an in-job verdict it shapes never reaches the node's
history unless a probe outside the job agrees.

Real parts: Slurm (srun --jobid, scontrol), the replay probe, node_check, the dcgmi JSON parser, a signed
alert, a local store. Mocked: `dcgmi` alone, in its own test. DCGM cannot run here (no GPU, no DCGM host
engine): elsewhere it is absent and the probe carries the verdict, as on every CPU node.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.signed_job import keyed_job, sign_as_job
from helpers.tracked_client import tracked_client
from longrun import alert_auth
from longrun.health import dcgm, probe_reference
from longrun.health import history as h
from longrun.health.ratelimit import DrainPolicy
from longrun.incident import hot_spare, record, runbooks, runner, step_diagnose, step_drain, steps
from longrun.incident.events import Event
from longrun.slurm import ops
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from longrun.tasks import node_history

from training.faults import sick_marker
from training.records import schema
from training.store.interface import NotFound
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES = ("n1", "n2", "n3")  # n1 hosts the batch script; n3 is the suspect
SUSPECT = "n3"


@pytest.fixture
def client(slurm_cluster) -> Iterator:
    with tracked_client(slurm_cluster.env["SLURM_CONF"]) as c:  # our jobs gone, our drains resumed
        yield c
    assert not [r for r in c.reservations() if r.startswith("longrun_")]


def kept_incident(
    tmp_path, client, store, *, run: str, tamper: bool = False, suspect: str = SUSPECT
) -> runner.Incident:
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
        "alert", run=run, step=17, check="recompute", suspect_ranks=[1], suspect_nodes=[suspect],
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


def diagnose_as_the_task(
    store, hist, client, inc, *, state_dir, python: str = sys.executable, node: str = SUSPECT
) -> dict:
    """What sdc_incident's diagnose task does (tasks.sdc_incident.diagnose_task, without Airflow): the probe
    inside the kept job, then the reservation path unless that recorded a diagnosis; the result goes into
    the node's history."""
    kw = {"partition": "debug", "state_dir": str(state_dir), "python": python}
    out = hot_spare.diagnose_in_job(store, client, inc, node=node, **kw)
    if out is None:
        run_nodes = inc.typed_alert.evidence_nodes
        out = step_diagnose.run_diagnosis(store, client, inc, node=node, run_nodes=run_nodes, **kw)
    node_history.after_diagnose(hist, inc, node, out)
    return out


def history_of(hist, node: str) -> tuple[list[str | None], list[str]]:
    """(the verdicts of the node's `diagnosed` events, the kinds of all its events)."""
    evs = h.events(hist, node)
    return [e.verdict for e in evs if e.kind == h.DIAGNOSED], [e.kind for e in evs]


def sick(state_dir: Path, node: str) -> Path:
    marker = sick_marker(state_dir, node)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("drill")
    return marker


def test_a_sick_node_is_probed_inside_the_job_released_and_convicted_in_isolation(tmp_path, client):
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    state_dir = tmp_path / "fault-state"
    sick(state_dir, SUSPECT)
    inc = kept_incident(tmp_path, client, store, run="inj1")
    assert hot_spare.freeze_kept(store, client, inc) is not None  # the job stays
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    out = diagnose_as_the_task(store, hist, client, inc, state_dir=state_dir)
    assert out["verdict"] == "fail", out
    # inside the job first (evidence), then in isolation: a reference on the idle n4, outside the job
    rec = record.load(store, run=inc.run, incident_id=inc.incident_id)
    evidence = inc.rec(store).event(Event.DIAGNOSED_IN_JOB)
    assert evidence is not None and evidence.details["verdict"] == "fail", evidence
    assert evidence.details["reference"]["computed"]["how"] == "in_job"
    assert evidence.details["reference"]["node"] in NODES[:2] and evidence.details["job_id"] == inc.job_id
    assert out["in_job_verdict"] == "fail" and out.get("where") is None
    assert out["reference_from"] == "idle_node" and out["reference_node"] == "n4", out
    assert rec["diagnosis"] == out and rec["reference"]["computed"]["how"] == "isolated"
    assert rec["diagnosis"]["reason"] == "longrun:diag-fail:inj1:17"
    events = [e["event"] for e in rec["timeline"]]
    assert events.index("diagnosed_in_job") < events.index("released") < events.index("diagnosed")
    assert Event.DIAGNOSIS_IN_JOB_SKIPPED not in events
    # confirmed outside the job, the fail reaches the history
    verdicts, kinds = history_of(hist, SUSPECT)
    assert verdicts == ["fail"] and h.REPLACE in kinds
    # released from the job, which keeps running on the rest; the node stays drained with the verdict
    job = client.job(inc.job_id)
    assert job.status is JobStatus.RUNNING and job.nodes == NODES[:2], job.describe()
    node = client.node(SUSPECT)
    assert node.drain_flag and node.reason == "longrun:diag-fail:inj1:17"
    assert not client.reservations()  # the isolated diagnosis removed its reservations
    # a rerun returns the recorded verdict and runs nothing
    assert hot_spare.diagnose_in_job(store, client, inc, node=SUSPECT, partition="debug") == out
    print(f"\nIN-JOB + ISOLATED DIAGNOSIS: {out['total_s']} s for the isolated part")


def test_an_in_job_verdict_reaches_the_history_only_when_a_probe_outside_the_job_agrees(tmp_path, client):
    """Attack: the kept job interferes with the steps the orchestrator runs inside its allocation. Here it
    makes the reference step on its own healthy node n1 compute a wrong fingerprint (the drill's sick
    marker for n1: n1 is the job's, so only steps inside the job run there), and the healthy suspect
    "fails" inside the job. Before, that in-job fail was the node's verdict: drained diag-fail, a failed
    diagnostic and a replacement mark in its history. Now it is evidence only: the node leaves the job
    and is probed in isolation against a reference on the idle n4, which passes it; the evidence
    disagrees, so the node stays drained `unconfirmed` for a person, with no fail and no mark."""
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    state_dir = tmp_path / "fault-state"
    sick(state_dir, "n1")  # the job's doing; the suspect n3 is healthy
    inc = kept_incident(tmp_path, client, store, run="inj5")
    hot_spare.freeze_kept(store, client, inc)
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    out = diagnose_as_the_task(store, hist, client, inc, state_dir=state_dir)
    verdicts, kinds = history_of(hist, SUSPECT)
    assert "fail" not in verdicts and h.REPLACE not in kinds, (verdicts, kinds)
    assert verdicts == ["unconfirmed"] and out["verdict"] == "unconfirmed", out["summary"]
    assert client.node(SUSPECT).reason == "longrun:diag-unconfirmed:inj5:17"
    assert out["runbook"] == runbooks.DIAGNOSTIC_FAILED
    # what the job made of it is kept as evidence; the isolated probe passed the node
    evidence = inc.rec(store).event("diagnosed_in_job")
    assert evidence is not None and evidence.details["verdict"] == "fail"
    assert out["in_job_verdict"] == "fail" and out["details"]["probe"]["verdict"] == "pass", out
    assert out["reference_from"] == "idle_node" and "the evidence disagrees" in out["summary"]
    assert SUSPECT not in client.job(inc.job_id).nodes


def test_a_node_that_cannot_leave_the_job_stays_unconfirmed(tmp_path, client):
    """The suspect runs the job's batch script (n1), so it is never released: no probe outside the job
    can reach it while the job runs. Its in-job fail (it is sick) is recorded as evidence and the diagnosis
    is `unconfirmed`, where `in_job`: drained so, in the history without a failed diagnostic or a mark."""
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    state_dir = tmp_path / "fault-state"
    sick(state_dir, "n1")
    inc = kept_incident(tmp_path, client, store, run="inj7", suspect="n1")
    hot_spare.freeze_kept(store, client, inc)
    step_drain.drain(store, client, inc, node="n1", policy=DrainPolicy(max_drains=5))
    out = diagnose_as_the_task(store, hist, client, inc, state_dir=state_dir, node="n1")
    assert out["verdict"] == "unconfirmed" and out["where"] == "in_job", out
    assert out["in_job_verdict"] == "fail" and "could not leave job" in out["summary"], out["summary"]
    assert inc.rec(store).event(Event.RELEASE_REFUSED) is not None
    assert "n1" in client.job(inc.job_id).nodes
    assert client.node("n1").reason == "longrun:diag-unconfirmed:inj7:17"
    verdicts, kinds = history_of(hist, "n1")
    assert verdicts == ["unconfirmed"] and h.REPLACE not in kinds
    with pytest.raises(NotFound):  # the job's reference was never cached
        store.get_bytes("ops/probe-reference/debug.json")


def ended_incident(tmp_path, client, store, *, run: str, suspect: str, nodes: tuple[str, ...]):
    """An incident about a signed alert of a finished longrun job of `run` on `nodes`, naming `suspect`,
    drained (the reservation path's incident)."""
    job_id, key = keyed_job(client, store, run=run, nodelist=nodes, workdir=tmp_path, partition="debug")
    alert = schema.record(
        "alert", run=run, step=17, check="recompute", suspect_ranks=[1], suspect_nodes=[suspect],
        evidence={"world": {"nodes": list(nodes)}},
    )  # fmt: skip
    inc = runner.Incident(
        run=run, alert_key=f"runs/{run}/alerts/00000017-recompute-r000-2.json",
        alert=sign_as_job(alert, job_id=job_id, key=key), job_id=job_id,
        run_params={"run_name": run, "nodes": len(nodes), "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id=f"test_{run}",
    )  # fmt: skip
    steps.open_record(store, inc)
    step_drain.drain(store, client, inc, node=suspect, policy=DrainPolicy(max_drains=5))
    return inc


def test_a_reference_poisoned_inside_a_job_is_not_cached_and_convicts_no_later_suspect(tmp_path, client):
    """Attack: as above, the kept job poisons the reference step that runs on its node n1. Before, that
    reference was cached for the partition, and a later incident there compared its suspect with it: a
    healthy node was convicted (a fail against a stored reference was final). Now an in-job reference is
    never cached: the cache holds only the isolated reference the confirmation computed, and the later
    healthy suspect passes."""
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    state_dir = tmp_path / "fault-state"
    poison = sick(state_dir, "n1")
    inc = kept_incident(tmp_path, client, store, run="inj6")
    hot_spare.freeze_kept(store, client, inc)
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    diagnose_as_the_task(store, hist, client, inc, state_dir=state_dir)
    # the job ends, and its interference with it
    client.cancel(inc.job_id)
    ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=60)
    poison.unlink()
    # a later incident in the partition, about the healthy n2, on the reservation path
    later = ended_incident(tmp_path, client, store, run="inj6b", suspect="n2", nodes=("n2", "n1", "n4"))
    out = step_diagnose.run_diagnosis(
        store, client, later, node="n2", run_nodes=("n1", "n4"), state_dir=str(state_dir),
        python=sys.executable, partition="debug",
    )  # fmt: skip
    node_history.after_diagnose(hist, later, "n2", out)
    assert out["verdict"] == "pass", out["summary"]
    verdicts, kinds = history_of(hist, "n2")
    assert verdicts == ["pass"] and h.REPLACE not in kinds
    # the cache never held the job's reference: only an isolated one, with the healthy fingerprint
    cached = json.loads(store.get_bytes("ops/probe-reference/debug.json"))
    poisoned = inc.rec(store).event("diagnosed_in_job").details["reference"]
    assert cached["computed"]["how"] == "isolated", cached
    assert cached["fingerprint"] == out["details"]["probe"]["result"]["fingerprint"]  # the healthy one
    assert poisoned["fingerprint"] != cached["fingerprint"]


def test_no_verdict_from_the_step_falls_back_after_releasing_the_node(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    inc = kept_incident(tmp_path, client, store, run="inj2")
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    ref = {"node": "n1", "verdict": "no-reference", "fingerprint": "0123456789abcdef", "torch": "2.0",
           "cpu_capability": "DEFAULT", "threads": 1,
           "computed": probe_reference.isolated_mark("n1", "longrun_ref_t_n1")}  # fmt: skip
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
    process's PATH (a MAINT reservation's step takes it the same way). The node is healthy (no sick marker:
    the probe passes), so DCGM's result alone decides the verdict, inside the job and then in isolation:
    the failing document convicts the node, the passing one leaves it diag-pass."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "dcgmi-calls"
    fake = bin_dir / "dcgmi"
    # the exit code is not what decides: node_check parses the JSON
    fake.write_text(FAKE_DCGMI.format(calls=calls, doc=DATA / doc, rc=0 if verdict == "pass" else 1))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    store, hist = LocalDirStore(tmp_path / "store"), LocalDirStore(tmp_path / "history")
    run = f"dcgm{verdict}"
    inc = kept_incident(tmp_path, client, store, run=run)
    step_drain.drain(store, client, inc, node=SUSPECT, policy=DrainPolicy(max_drains=5))
    out = diagnose_as_the_task(store, hist, client, inc, state_dir=tmp_path / "no-faults")
    assert out["in_job_verdict"] == verdict, out
    # dcgmi ran twice, in the step on the suspect inside the job and then in its MAINT reservation, at
    # the level a recompute alert calls for
    assert calls.read_text().splitlines() == ["diag -r 3 -j"] * 2
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
    assert history_of(hist, SUSPECT)[0] == [verdict]
