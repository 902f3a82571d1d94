"""The acceptance drill, end to end on the local stack (Slurm n1..n4, SeaweedFS, Airflow scheduler +
triggerer), driven through Airflow's REST API as a user would.

A clean 3-node run gives the reference fingerprint. Then, for each fault kind, a 3-node run with a drill
(n4 stays spare): the alert names the node; it is drained with longrun's reason; the diagnostic runs
there (and FAILS for a sick node, whose fault persists; a transient weight flip or NaN leaves a healthy
node, so its diagnostic passes and it waits, drained, for a person's return-to-service decision); the run
relaunches on three healthy nodes (the spare joins) from the pre-incident checkpoint, completes, and its
final weights are bit-identical to the clean run's. Prints detection step, lost steps and alert ->
relaunched RUNNING for each.
"""

from __future__ import annotations

import os
import time

import pytest
from longrun.drill import DRILL_CONF, Rest, prepare, return_to_service, run_drill
from longrun.slurm.client import make_client

from training.store import store_from_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(5400),
]

DRILLS = {
    # kind: (drill, checks that may catch it first, diagnostic verdict). A flipped weight changes that
    # replica's next gradients, so the recompute audit at step 15 can see it before the weight vote does.
    "sick-node": ({"kind": "sick-node", "step": 17, "target": "n2"}, ("recompute",), "fail"),
    "weight-flip": ({"kind": "weight-flip", "step": 13, "target": "1"}, ("weight_vote", "recompute"), "pass"),
    "nan": ({"kind": "nan", "step": 13, "target": "2"}, ("finite",), "pass"),
}
# Run names are unique per session: the store keeps every run, and a run name is a run's identity.
STAMP = time.strftime("%H%M%S")


def name(kind: str) -> str:
    return f"e2e{STAMP}-{kind}"


@pytest.fixture(scope="module")
def env(airflow_stack, monkeypatch_module):
    for k, v in airflow_stack.env.items():
        monkeypatch_module.setenv(k, v)
    return airflow_stack


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def rest(env):
    r = Rest.login(env.url, env.user, env.password)
    prepare(r)
    return r


@pytest.fixture(scope="module")
def clean(rest):
    result = run_drill(rest, store_from_env(), {**DRILL_CONF, "run_name": name("clean")})
    print("\n" + result.summary())
    assert result.incident is None and result.final_step == DRILL_CONF["steps"]
    return result


@pytest.mark.parametrize("kind", list(DRILLS))
def test_drill(rest, clean, kind):
    drill, check, verdict = DRILLS[kind]
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)  # the previous drill's node, as the runbook's return-to-service would
    result = run_drill(rest, store_from_env(), {**DRILL_CONF, "run_name": name(kind), "drill": drill})
    print("\n" + result.summary())
    print(
        f"DRILL {kind}: detection step {result.detection_step}, lost steps {result.lost_steps}, "
        f"alert -> relaunched RUNNING {result.recover_s} s"
    )
    inc = result.incident
    assert inc is not None, "no incident record"
    assert inc.status == "relaunched"
    assert inc.alert["check"] in check
    node = inc.attribution.node
    assert inc.alert["suspect_nodes"] == [node]
    if kind == "sick-node":
        assert node == "n2"
    assert (inc.drain.reason or "").startswith(f"longrun:sdc:{name(kind)}:")
    assert inc.diagnosis.verdict == verdict, inc.diagnosis.summary
    state = client.node(node)
    assert state.drain_flag and state.reason == f"longrun:diag-{verdict}:{name(kind)}:{result.detection_step}"
    relaunch = inc.relaunch
    nodes = relaunch.nodes or ()
    assert node not in nodes and len(nodes) == 3 and "n4" in nodes
    assert inc.checkpoint.step is not None and inc.checkpoint.step < result.detection_step
    assert result.final_step == DRILL_CONF["steps"]
    assert result.final_fingerprint == clean.final_fingerprint, "final weights differ from the clean run"
    # the relaunch's own checkpoints (after the demoted interval) are promoted, the final one included
    assert result.promoted_steps[-1] == DRILL_CONF["steps"], result.promoted_steps
    assert_resumed_as_picked(result)


def assert_resumed_as_picked(result):
    """Proof of resume from the records: the relaunch's first step is the pick's step + 1 (a relaunch that
    started over at step 0 ends with the same weights, so the fingerprint alone cannot tell), and lost
    steps are read from the segments, not computed."""
    inc = result.incident
    pick = inc.checkpoint.step
    assert pick is not None
    segs = result.segments
    assert len(segs) >= 2, segs
    # the first launch, any NVRx in-job restarts it made, then the relaunch (the last segment)
    first, before, relaunch = segs[0], segs[-2], segs[-1]
    assert (first["start_step"], first["resumed_from"]) == (0, None)
    assert first["last_step"] == result.detection_step and before["exit"] == "sdc_verdict"
    assert relaunch["job_id"] == str(inc.relaunch.job_id)
    assert relaunch["start_step"] == pick and relaunch["first_step"] == pick + 1, relaunch
    assert relaunch["resumed_from"].rstrip("/").endswith(f"step-{pick:08d}")
    assert relaunch["exit"] == "done" and relaunch["last_step"] == DRILL_CONF["steps"]
    assert relaunch["lost_steps_before"] == before["last_step"] - pick
    rec = result.recovery
    assert rec["resumed_as_picked"] is True and rec["lost_steps"] == relaunch["lost_steps_before"]
    ms = rec["milestones_s"]
    assert ms["fault_injected"] is not None and ms["fault_injected"] <= 0
    order = ["alert_written", "alert_seen", "relaunch_submitted", "relaunched_running", "first_healthy_step"]
    assert [ms[k] for k in order] == sorted(ms[k] for k in order), ms
    print(f"RECOVERY {result.run}: alert -> first healthy step {result.to_training_s} s; milestones {ms}")


def test_hot_spare_drill_recovers_inside_the_job(rest, clean):
    """spare_nodes=1: the job holds 4 nodes and trains on 3. The sick node is drained, diagnosed as a step
    of the same job (no MAINT reservation), released from the job still drained with the failing verdict,
    and the run continues INSIDE the same job (no new job, no queue) from the pick."""
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)
    drill = {"kind": "sick-node", "step": 17, "target": "n2"}
    conf = {**DRILL_CONF, "run_name": name("hotspare"), "spare_nodes": 1, "drill": drill}
    result = run_drill(rest, store_from_env(), conf)
    print("\n" + result.summary())
    inc = result.incident
    assert inc is not None and inc.status == "relaunched"
    relaunch = inc.relaunch
    assert relaunch.in_job is True, relaunch
    events = [e.event for e in inc.timeline]
    assert {"released", "directive_written"} <= set(events) and "relaunch_submitted" not in events
    node = inc.attribution.node
    assert node == "n2" and node not in (relaunch.nodes or ())
    first, again = result.segments[0], result.segments[-1]
    assert first["job_id"] == again["job_id"] == str(relaunch.job_id), "the job id changed"
    assert node in first["nodes"] and node not in again["nodes"]
    # the diagnosis ran inside the job's allocation (longrun.incident.inalloc), not in a MAINT reservation,
    # and convicted the sick node (its fault persists: the probe's fingerprint differs from the reference's)
    diag = inc.diagnosis
    assert diag.where == "in_job", diag
    assert diag.job_id == relaunch.job_id and diag.node == node, diag
    assert diag.verdict == "fail", diag.summary
    probe = diag.details.probe if diag.details else None
    assert probe is not None and probe.verdict == "fail", diag.details
    assert diag.reference_node and diag.reference_node != node, diag
    assert "diagnosis_in_job_skipped" not in events and "diagnosed" in events, events
    assert inc.event("diagnosed").details.get("where") == "in_job"
    # released from the job after the verdict (a release before it would have killed the probe step)
    released = inc.event("released")
    assert released is not None and released.details["node"] == node, released
    assert node not in released.details["kept"] and len(released.details["kept"]) == 3, released
    # ... still drained, the reason carrying the failing verdict, the run and the detection step
    reason = f"longrun:diag-fail:{name('hotspare')}:{result.detection_step}"
    assert diag.reason == reason
    state = client.node(node)
    assert state.drain_flag and state.reason == reason, (state.state, state.reason)
    assert result.final_fingerprint == clean.final_fingerprint, "final weights differ from the clean run"
    assert_resumed_as_picked(result)
    print(f"HOT SPARE DRILL: alert -> first healthy step {result.to_training_s} s (in-job)")


def test_rerunning_the_incident_changes_nothing(rest, clean):
    """Clear the whole sdc_incident run of the sick-node drill (as after a scheduler crash): it runs again
    and never drains twice, never submits twice, never loses or doubles the incident record."""
    from longrun.incident import ratelimit
    from longrun.slurm.spec import JobTag

    from training.store import get_json

    store = store_from_env()
    run = name("sick-node")
    # incident records only: an incident's plots lie below incidents/<id>/
    keys = [o.key for o in store.list(f"runs/{run}/incidents/") if o.key.endswith(".json")]
    if not keys:
        pytest.skip("the sick-node drill did not run")
    before = get_json(store, keys[0])
    incident_run = f"incident__{before['incident_id']}"
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    node = before["attribution"]["node"]
    # The node as the incident left it (drained with its diagnosis's reason), as after a scheduler crash:
    # the tests in between return their nodes to service, so this test sets the state it starts from.
    reason = before["diagnosis"]["reason"]
    assert reason.startswith("longrun:diag-"), before["diagnosis"]
    client.drain(node, reason)
    drains = [e for e in ratelimit.entries(store) if e["incident_id"] == before["incident_id"]]
    rest.call(
        "POST",
        "/dags/sdc_incident/clearTaskInstances",
        json={"dag_run_id": incident_run, "dry_run": False, "only_failed": False, "reset_dag_runs": True},
    )
    import time as _time

    from longrun.drill import _follow

    state = _follow(
        rest, "sdc_incident", incident_run, deadline=_time.monotonic() + 900, say=print, progress=None
    )
    assert state == "success"
    after = get_json(store, keys[0])
    events = [e["event"] for e in after["timeline"]]
    assert len(events) == len(set(events)), f"an event was recorded twice: {events}"
    assert events == [e["event"] for e in before["timeline"]]
    assert after["relaunch"]["job_id"] == before["relaunch"]["job_id"]
    assert [e for e in ratelimit.entries(store) if e["incident_id"] == before["incident_id"]] == drains
    assert client.node(node).reason == reason
    tag = JobTag(dag_id="sdc_incident", run_id=incident_run, task_id="relaunch")
    # A second submission would still be known to Slurm (queued, running or just finished); the first
    # one may already be forgotten (it completed minutes ago).
    assert {j.job_id for j in client.find_jobs(tag.prefix())} <= {before["relaunch"]["job_id"]}


def test_observe_mode_changes_nothing(rest, clean):
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)
    drill = {"kind": "nan", "step": 13, "target": "1"}
    result = run_drill(
        rest,
        store_from_env(),
        {**DRILL_CONF, "run_name": name("observe"), "incident_mode": "observe", "drill": drill},
    )
    print("\n" + result.summary())
    inc = result.incident
    assert inc is not None and inc.status == "observed" and inc.mode == "observe"
    events = [e.event for e in inc.timeline]
    assert {"would_drain", "would_diagnose", "would_relaunch"} <= set(events)
    assert not {"drained", "diagnosed", "relaunched_running"} & set(events)
    assert not any(n.drain_flag for n in client.nodes()), "observe mode drained a node"
    assert [d[0] for d in result.dag_runs] == ["training_run", "sdc_incident"]


def test_approve_mode_asks_a_person_twice(rest, clean):
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)
    drill = {"kind": "nan", "step": 13, "target": "1"}
    result = run_drill(
        rest,
        store_from_env(),
        {**DRILL_CONF, "run_name": name("approve"), "incident_mode": "approve", "drill": drill},
        approve=True,
    )
    print("\n" + result.summary())
    assert result.incident is not None and result.incident.status == "relaunched"
    states = rest.task_states("sdc_incident", result.dag_runs[1][1])
    assert states["approve_drain"] == "success" and states["approve_relaunch"] == "success"
    assert result.final_fingerprint == clean.final_fingerprint
    assert_resumed_as_picked(result)
