"""A drill fires or says why not: preflight refuses a drill whose target the run cannot reach (real Slurm,
the four-node test cluster), a sick-node target is pinned into the allocation, and a drill run whose
fault never fired ends failed naming the drill (local-directory store, the trainer's real record types).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
from longrun import drillcheck
from longrun.incident import hot_spare, recovery
from longrun.monitor import lifecycle, segments
from longrun.slurm import ops
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobTag

from training.records import schema
from training.records.orchestrator import Incident as IncidentRecord
from training.segment import FaultFired, Segment
from training.spares.directive import Directive
from training.store.interface import get_json, put_json
from training.store.local import LocalDirStore

FOREIGN = "test:drill-preflight"  # not longrun's prefix: an operator's drain


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def params(run: str, drill: dict | None, **kw) -> dict:
    return {"run_name": run, "nodes": 2, "gpus_per_node": 0, "steps": 20, "drill": drill,
            "attach_job_id": None, **kw}  # fmt: skip


@pytest.mark.slurm
def test_preflight_refuses_a_drill_it_cannot_reach(tmp_path, client, slurm_cluster):
    store = LocalDirStore(tmp_path / "store")
    sick = {"kind": "sick-node", "step": 5}
    assert client.node("n3").drain_flag is False, "n3 must start idle"
    scontrol = ["scontrol", "update", "NodeName=n3"]
    subprocess.run(
        [*scontrol, "State=DRAIN", f"Reason={FOREIGN}"], env=slurm_cluster.client_env(), check=True
    )
    try:
        with pytest.raises(
            RuntimeError, match=r"sick-node:5:n3 refused: node n3 is drained \(test:drill-preflight"
        ):
            lifecycle.preflight(store, client, params("pf", {**sick, "target": "n3"}))
        with pytest.raises(RuntimeError, match="node n9 is not a node of this cluster"):
            lifecycle.preflight(store, client, params("pf", {**sick, "target": "n9"}))
        with pytest.raises(RuntimeError, match="node n2 is excluded"):
            lifecycle.preflight(store, client, params("pf", {**sick, "target": "n2"}, exclude=["n2"]))
        # a transient fault aimed at a node is held to the same rules
        with pytest.raises(RuntimeError, match=r"nan:5:n3 refused: node n3 is drained"):
            lifecycle.preflight(store, client, params("pf", {"kind": "nan", "step": 5, "target": "n3"}))
        resumed = params("pf", {"kind": "nan", "step": 8, "target": "1"},
                         resume_from="runs/pf/checkpoints/step-00000010/")  # fmt: skip
        with pytest.raises(RuntimeError, match="step 8 is at or before the resumed checkpoint's step 10"):
            lifecycle.preflight(store, client, resumed)
        # reachable drills pass
        assert (
            lifecycle.preflight(store, client, params("pf", {**sick, "target": "n2"}))["drill"]
            == "sick-node:5:n2"
        )
        assert lifecycle.preflight(store, client, params("pf", {"kind": "nan", "step": 5, "target": "1"}))
    finally:
        subprocess.run([*scontrol, "State=RESUME"], env=slurm_cluster.client_env(), check=True)
    assert not client.node("n3").drain_flag


@pytest.mark.slurm
def test_a_sick_node_target_is_in_the_allocation(tmp_path, client, monkeypatch):
    """Without the pin a one-node job lands on the first idle node (n1), and the drill on n4 never fires."""
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(tmp_path / "runs"))
    spec = lifecycle.spec_from_params(
        {k: v for k, v in params("pin", {"kind": "sick-node", "step": 5, "target": "n4"}, nodes=1).items()}
    )
    job = lifecycle.make_job(spec, JobTag(dag_id="training_run", run_id="pin", task_id="submit"))
    assert job.nodelist == ("n4",)
    flip = {"kind": "weight-flip", "step": 5, "target": "n4"}
    by_node = lifecycle.spec_from_params(params("pin", flip, nodes=1))
    assert lifecycle.make_job(
        by_node, JobTag(dag_id="training_run", run_id="pin", task_id="submit")
    ).nodelist == ("n4",)
    by_rank = lifecycle.spec_from_params(params("pin", {**flip, "target": "0"}, nodes=1))
    assert (
        lifecycle.make_job(by_rank, JobTag(dag_id="training_run", run_id="pin", task_id="submit")).nodelist
        == ()
    )
    # Run only a sleep with the same placement (the trainer is not the point here).
    job_id = client.submit(dataclasses.replace(job, command=("sleep 60",), env={}))
    try:
        state = ops.wait_for(
            client, job_id, lambda s: s.status is JobStatus.RUNNING or s.is_terminal, timeout_s=60
        )
        assert state.status is JobStatus.RUNNING and state.nodes == ("n4",), state.describe()
    finally:
        client.cancel(job_id)
        ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)


def _trainer_report(store, run: str) -> None:
    put_json(store, schema.store_key(run, schema.REPORT_PATH),
             schema.record("report", run=run, final_step=20, final_fingerprint="f" * 16))  # fmt: skip


def _put(store, run: str, rec) -> None:
    put_json(store, schema.store_key(run, rec.relative_path), rec.to_json())


def test_a_drill_that_never_fired_fails_the_run_naming_the_drill(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    drill = {"kind": "sick-node", "step": 5, "target": "n4"}
    _trainer_report(store, "nf")
    with pytest.raises(segments.DrillNotFired, match="drill sick-node:5:n4 never fired"):
        lifecycle.finish(store, {"job_id": 7}, params("nf", drill))
    report = get_json(store, schema.store_key("nf", schema.REPORT_PATH))
    assert report["orchestrator"]["drill"]["fired"] is False

    # a crash drill that fired and was handled in the job (no SDC alert) finishes normally
    _trainer_report(store, "ok")
    _put(
        store,
        "ok",
        FaultFired(run="ok", fault="crash", step=5, rank=1, node="n2", time=1.0, spec="crash:5:1"),
    )
    out = lifecycle.finish(store, {"job_id": 8}, params("ok", {"kind": "crash", "step": 5, "target": "1"}))
    assert out["orchestrator"]["drill"] == {"drill": "crash:5:1", "fired": True, "step": 5, "nodes": ["n2"],
                                            "time": 1.0}  # fmt: skip


def _segment(**kw) -> Segment:
    base = dict(run="rc", job_id="11", restart_count=0, world_size=3, nodes=("n1", "n2", "n3"))
    return Segment(**{**base, **kw})


def _launch(t: float, *, last_step: int) -> Segment:
    """Job 11's launch: trained from scratch until the verdict at `last_step`, ended just after alert time t."""
    return _segment(segment_id="11.0-r0", start_step=0, resumed_from=None, started_at=t - 30, first_step=1,
                    first_healthy_step=1, first_healthy_time=t - 29, last_step=last_step, ended_at=t + 1,
                    exit="sdc_verdict")  # fmt: skip


def _relaunched(run: str, t: float, *, relaunch: dict, timeline: list[dict]) -> dict:
    """Incident i1 of an alert at step 20 (time t) on n2, relaunched from step 10 as `relaunch` says."""
    alert = {"step": 20, "check": "recompute", "time": t, "suspect_nodes": ["n2"]}
    return schema.record(
        "incident", run=run, incident_id="i1", alert=alert, mode="act", status="relaunched",
        checkpoint={"step": 10}, relaunch=relaunch, timeline=timeline,
    )  # fmt: skip


def test_recovery_is_measured_from_the_records(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    run, t = "rc", 1000.0
    segs = [
        _segment(segment_id="11.0-r0", start_step=0, resumed_from=None, started_at=t - 30, first_step=1,
                 first_healthy_step=1, first_healthy_time=t - 29, last_step=17, ended_at=t + 1, exit="sdc_verdict"),
        _segment(segment_id="12.0-r0", job_id="12", start_step=10, resumed_from="runs/rc/checkpoints/step-00000010/",
                 started_at=t + 9, first_step=11, first_healthy_step=11, first_healthy_time=t + 12.5,
                 nodes=("n1", "n3", "n4")),
    ]  # fmt: skip
    for s in segs:
        _put(store, run, s)
    _put(store, run, FaultFired(run=run, fault="sick-node", step=17, rank=1, node="n2", time=t - 0.4,
                                spec="sick-node:17:n2"))  # fmt: skip
    alert = {"step": 17, "check": "recompute", "time": t, "suspect_nodes": ["n2"]}
    incident = schema.record(
        "incident", run=run, incident_id="i1", alert=alert, mode="act", status="relaunched",
        checkpoint={"step": 10}, relaunch={"job_id": 12},
        timeline=[{"event": "opened", "time": t + 2}, {"event": "alert_seen", "time": t + 1.5},
                  {"event": "drained", "time": t + 4}, {"event": "relaunch_submitted", "time": t + 6},
                  {"event": "relaunched_running", "time": t + 7}],
    )  # fmt: skip
    put_json(store, schema.store_key(run, schema.incident_path("i1")), incident)
    got = recovery.record(store, run, "i1")
    assert got is not None
    assert got["milestones_s"] == {"fault_injected": -0.4, "alert_written": 0.0, "alert_seen": 1.5, "drained": 4.0,
                                   "relaunch_submitted": 6.0, "relaunched_running": 7.0,
                                   "first_healthy_step": 12.5}  # fmt: skip
    assert got["alert_to_first_healthy_step_s"] == 12.5
    assert (got["first_step"], got["pick_step"], got["resumed_as_picked"], got["lost_steps"]) == (
        11,
        10,
        True,
        7,
    )
    # recorded once: a rerun changes nothing
    rec = json.loads(store.get_bytes(schema.store_key(run, schema.incident_path("i1"))))
    assert [e["event"] for e in rec["timeline"]].count("first_healthy_step") == 1
    assert recovery.record(store, run, "i1") == got
    rec2 = json.loads(store.get_bytes(schema.store_key(run, schema.incident_path("i1"))))
    assert rec2 == rec
    # a relaunch that started over at step 0 is caught
    _put(store, run, dataclasses.replace(segs[1], start_step=0, resumed_from=None, first_step=1))
    bad = recovery.measure(IncidentRecord.from_json(incident), segments.segments(store, run), [])
    assert bad["resumed_as_picked"] is False and bad["lost_steps"] == 17


def test_an_nvrx_restart_after_the_alert_is_not_the_in_job_relaunch():
    """Hot spare: the kept job's step 0 raised the alert, NVRx restarted it once more (r1, on the sick node,
    until the verdict came again), then the supervisor ran the directed attempt as step 2. The recovery is
    measured to step 2, and lost steps from the segment just before it (seen in a CI replica, where r1 was
    taken for the relaunch: lost steps and time to training came out wrong)."""
    run, t = "rc", 1000.0
    segs = [
        _launch(t, last_step=20),
        _segment(segment_id="11.0-r1", restart_count=1, start_step=10, resumed_from="/tmp/x/step-00000010",
                 started_at=t + 48, first_step=11, first_healthy_step=11, first_healthy_time=t + 48.1,
                 last_step=15, ended_at=t + 48.5, exit="sdc_verdict"),
        _segment(segment_id="11.2-r0", start_step=10, resumed_from="runs/rc/checkpoints/step-00000010/",
                 started_at=t + 94, first_step=11, first_healthy_step=11, first_healthy_time=t + 94.8,
                 last_step=40, exit="done", nodes=("n1", "n3", "n4")),
    ]  # fmt: skip
    incident = _relaunched(run, t, relaunch={"job_id": 11, "in_job": True}, timeline=[
        {"event": "opened", "time": t + 18}, {"event": "directive_written", "time": t + 65},
        {"event": "relaunched_running", "time": t + 93.7},
    ])  # fmt: skip
    got = recovery.measure(IncidentRecord.from_json(incident), segs, [])
    assert got["relaunch_segment"] == "11.2-r0"
    assert got["milestones_s"]["first_healthy_step"] == 94.8
    assert (got["resumed_as_picked"], got["lost_steps"]) == (True, 5)
    # a relaunch as a new job (no in_job) still takes that job's first segment after the alert
    requeued = dict(incident, relaunch={"job_id": 12})
    segs12 = [*segs[:2], dataclasses.replace(segs[2], segment_id="12.0-r0", job_id="12")]
    assert recovery.measure(IncidentRecord.from_json(requeued), segs12, [])["relaunch_segment"] == "12.0-r0"


def test_a_restart_that_trained_nothing_does_not_hide_the_lost_steps():
    """NVRx restarted the workers after the verdict (r1); the restart saw the launch's verdict and exited 93
    before its first step, so its record has no last_step (seen in a CI run, where the lost steps of the
    relaunch came out None). Lost steps are counted from r0, the last segment that trained."""
    run, t = "rc", 1000.0
    segs = [
        _launch(t, last_step=20),
        _segment(segment_id="11.0-r1", restart_count=1, start_step=0, resumed_from=None, started_at=t - 1,
                 ended_at=t + 2, exit="sdc_verdict"),
        _segment(segment_id="12.0-r0", job_id="12", start_step=10, resumed_from="runs/rc/checkpoints/step-00000010/",
                 started_at=t + 20, first_step=11, first_healthy_step=11, first_healthy_time=t + 24,
                 last_step=40, exit="done", nodes=("n1", "n3", "n4")),
    ]  # fmt: skip
    incident = _relaunched(run, t, relaunch={"job_id": 12}, timeline=[{"event": "opened", "time": t + 2}])
    got = recovery.measure(IncidentRecord.from_json(incident), segs, [])
    assert (got["relaunch_segment"], got["resumed_as_picked"], got["lost_steps"]) == ("12.0-r0", True, 10)
    table = segments.segment_table(segs)
    assert [row["lost_steps_before"] for row in table] == [None, 20, 10]
    # nothing trained before: nothing to lose, and no error
    assert segments.segment_table(segs[1:])[1]["lost_steps_before"] is None


def test_the_directed_attempt_is_a_new_job_step():
    """hot_spare.attempt_segment: an NVRx restart of step 0 that starts after the directive is not the attempt
    the directive asked for; the attempt's own step is."""
    t = 1000.0
    d = Directive(run="rc", job_id="11", attempt=1, nodes=("n1", "n3", "n4"), resume_from="runs/rc/checkpoints/step-00000010/",
                  incident_id="i1", exclude=("n2",), issued_at=t + 65)  # fmt: skip
    r0 = _segment(segment_id="11.0-r0", start_step=0, resumed_from=None, started_at=t - 30)
    late_restart = _segment(
        segment_id="11.0-r1", restart_count=1, start_step=10, resumed_from=None, started_at=t + 70
    )
    attempt = _segment(segment_id="11.2-r0", start_step=10, resumed_from=d.resume_from, started_at=t + 94)
    other_job = _segment(
        segment_id="12.0-r0", job_id="12", start_step=10, resumed_from=None, started_at=t + 80
    )
    assert hot_spare.attempt_segment([r0, late_restart, other_job], d) is None
    assert hot_spare.attempt_segment([r0, late_restart, other_job, attempt], d) == attempt


def test_resume_step_reads_checkpoint_references():
    assert drillcheck.resume_step("runs/x/checkpoints/step-00000010/") == 10
    assert drillcheck.resume_step("/tmp/run/checkpoints/step-00000004") == 4
    assert drillcheck.resume_step(None) is None and drillcheck.resume_step("runs/x/other") is None


def test_the_run_report_summarises_the_typed_incidents(tmp_path):
    """The report's incident rows come from typed incident records; one that does not read is left out
    (and logged), not allowed to fail the finish."""
    store = LocalDirStore(tmp_path / "store")
    run = "ri"
    _trainer_report(store, run)
    incident = schema.record(
        "incident", run=run, incident_id="i1", alert={"step": 17, "check": "recompute"}, mode="act",
        status="relaunched", attribution={"verdict": "node", "node": "n2"}, lost_steps=7,
        time_to_recover_s=12.5, recovery={"lost_steps": 7}, timeline=[{"event": "opened", "time": 1.0}],
    )  # fmt: skip
    put_json(store, schema.store_key(run, schema.incident_path("i1")), incident)
    put_json(
        store,
        schema.store_key(run, schema.incident_path("i2")),
        {**incident, "incident_id": "i2", "status": 3},
    )
    out = lifecycle.finish(store, {"job_id": 9}, params(run, None))
    assert out["orchestrator"]["incidents"] == [
        {"incident_id": "i1", "status": "relaunched", "alert_step": 17, "check": "recompute", "node": "n2",
         "lost_steps": 7, "time_to_recover_s": 12.5, "recovery": {"lost_steps": 7}}
    ]  # fmt: skip
    assert type(out["orchestrator"]["incidents"][0]["status"]) is str
