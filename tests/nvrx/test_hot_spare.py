"""Hot spares on the real four-node cluster: a 3-node run that holds a 4th node (spare_nodes=1).

The test plays the orchestrator's part the way sdc_incident does in act mode (drain the suspect, shrink
the job, write the directive with the pre-incident checkpoint) and checks that the job recovers INSIDE
its allocation: same job id, first step after the relaunch == the pick + 1, final weights bit-identical
to a clean run. Without a directive the job ends with 93, the full relaunch's cue.

Real parts: Slurm, srun, NVRx 0.4.1's ft_launcher, gloo, the reference trainer, the supervisor.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.clean_reference import CleanRun
from helpers.marks import only_in_test_drills
from longrun.drill import DRILL_CONF
from longrun.incident import hot_spare
from longrun.launch import job_spec_for_run, run_dir_for
from longrun.monitor import lifecycle
from longrun.runspec import Drill, RunSpec
from longrun.slurm import ops
from longrun.slurm.models import ACTIVE, JobStatus
from longrun.slurm.spec import JobTag

from training.records import schema
from training.segment import Segment, ordered
from training.spares.directive import Directive
from training.store.interface import get_json, put_json
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REASON = "longrun:test:hot-spare"
STEPS, ALERT_STEP, PICK = DRILL_CONF["steps"], 25, 20


def tiny(name: str, **kw) -> RunSpec:
    """The drills' run (3 CPU nodes, 40 steps of the tiny model, checkpoints every 10, checks every 5) as
    training_run would launch it, named `name`: the session's `drill_reference` is its run without a fault."""
    base = lifecycle.spec_from_params({**DRILL_CONF, "run_name": name})
    return dataclasses.replace(base, **{"max_restarts": 1, "time_limit_min": 10, **kw})


def _submit(launcher, run: RunSpec, wait_s: int) -> int:
    tag = JobTag(dag_id="tests_nvrx", run_id=run.run_name, task_id="launch")
    env = {**launcher.env, "LONGRUN_DIRECTIVE_WAIT_S": str(wait_s)}
    spec = job_spec_for_run(run, tag=tag, run_dir_root=str(launcher.root), env=env, nvrx=launcher.nvrx,
                            python=sys.executable)  # fmt: skip
    job_id = launcher.client.submit(spec)
    launcher.jobs.append(job_id)
    return job_id


def _wait(what: str, probe, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)


def _segments(store, run: str) -> list[Segment]:
    keys = [o.key for o in store.list(schema.store_key(run, "segments/"))]
    return ordered([Segment.from_json(store.get_bytes(k)) for k in keys])


def _log(launcher, run: str, job_id: int) -> str:
    path = Path(launcher.root) / f"{run}.slurm-{job_id}.out"
    return path.read_text() if path.exists() else ""


def _first_alert(store, run: str) -> dict:
    key = _wait("alert", lambda: [o.key for o in store.list(schema.store_key(run, "alerts/"))])[0]
    return get_json(store, key)


def _direct_and_finish(launcher, run: str, job_id: int, *, nodes: tuple[str, ...], exclude: str) -> str:
    """Play the orchestrator's directive (attempt 1 from the pick, on `nodes`), wait for the job to end,
    and return its log; the job must end COMPLETED with 0."""
    store = LocalDirStore(launcher.env["LONGRUN_STORE_DIR"])
    # the standby started at the alert, beside the alerting step (named for its attempt): as sdc_incident
    # does, the directive waits until that step has ended
    assert hot_spare.earlier_steps(launcher.client, job_id, 1, timeout_s=120) == []
    d = Directive(run=run, job_id=str(job_id), attempt=1, nodes=nodes,
                  resume_from=schema.store_key(run, schema.checkpoint_dir(PICK)), incident_id="test",
                  exclude=(exclude,), issued_at=time.time())  # fmt: skip
    put_json(store, schema.store_key(run, d.relative_path), d.to_json())
    final = ops.wait_for(launcher.client, job_id, lambda s: s.status not in ACTIVE, timeout_s=420, poll_s=1.0)
    log = _log(launcher, run, job_id)
    assert final.status is JobStatus.COMPLETED and final.exit_code == 0, final.describe() + log[-3000:]
    return log


@pytest.fixture(scope="module")
def clean_fp(drill_reference: CleanRun) -> str:
    """The final weights of the runs here without their fault (`tiny` is the drills' run)."""
    return drill_reference.final_fingerprint


def test_a_verdict_recovers_on_the_spare_inside_the_same_job(launcher, clean_fp, slurm_cluster):
    """`make test-drills` only: in `make test` the test below proves a directed attempt trains on to the
    clean run's weights inside the same job, and the hot-spare drill through Airflow
    (tests/e2e/test_drill.py) proves the whole path with the orchestrator's own drain, release and
    directive. About 106 busy CPU-seconds on two cores."""
    only_in_test_drills(
        "the directed attempt is proven by the next test and by the hot-spare drill in tests/e2e"
    )
    run = tiny("hs-spare", spare_nodes=1, drill=Drill(kind="nan", step=ALERT_STEP, target="1"))
    store = LocalDirStore(launcher.env["LONGRUN_STORE_DIR"])
    job_id = _submit(launcher, run, wait_s=180)
    client, suspect = launcher.client, None
    try:
        held = ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60).nodes
        assert len(held) == 4
        alert = _first_alert(store, run.run_name)
        (suspect,) = alert["suspect_nodes"]
        # the orchestrator's part: drain, release the node from the job, direct the next attempt
        client.drain(suspect, REASON)
        keep = [n for n in held if n != suspect]
        # Which node holds rank 1 is the rendezvous' choice. The node running the batch script (the
        # supervisor) is never released, as in sdc_incident: it stays in the job, drained and undirected.
        if suspect != client.batch_host(job_id):
            subprocess.run(["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}"],
                           env=slurm_cluster.client_env(), check=True, timeout=30)  # fmt: skip
        ckpt = schema.store_key(run.run_name, schema.checkpoint_dir(PICK))
        _wait(
            "pick's manifest", lambda: store.head(schema.store_key(run.run_name, schema.manifest_path(PICK)))
        )
        # the directive comes while the next attempt's standby waits for it, as after an incident's steps
        _wait("the standby", lambda: "standby: waiting" in _log(launcher, run.run_name, job_id))
        assert "longrun-attempt-1" in [name for _, name in client.job_steps(job_id)]  # the waiting standby
        log = _direct_and_finish(launcher, run.run_name, job_id, nodes=tuple(keep), exclude=suspect)
        assert "the standby is directed: it trains" in log and "stopping the standby" not in log
        node = client.node(suspect)
        assert node.drain_flag and node.reason == REASON
    finally:
        # Leave the cluster as found whatever failed: a still-running job is cancelled, the node resumed.
        try:
            ops.wait_for(client, job_id, lambda s: s.status not in ACTIVE, timeout_s=60)
        except Exception:
            client.cancel(job_id)
            ops.wait_for(client, job_id, lambda s: s.status not in ACTIVE, timeout_s=60)
        if suspect is not None and client.node(suspect).reason == REASON:
            client.resume(suspect)
    first, relaunch = _segments(store, run.run_name)
    assert first.job_id == relaunch.job_id == str(job_id)  # no new job, no queue
    assert (first.exit, first.last_step) == ("sdc_verdict", ALERT_STEP)
    assert (relaunch.start_step, relaunch.first_step, relaunch.resumed_from) == (PICK, PICK + 1, ckpt)
    assert suspect not in relaunch.nodes and relaunch.exit == "done"
    report = get_json(store, schema.store_key(run.run_name, schema.REPORT_PATH))
    assert report["final_fingerprint"] == clean_fp, "final weights differ from the clean run"
    print(f"\nHOT SPARE: alert -> first healthy step {relaunch.first_healthy_time - alert['time']:.1f} s "
          f"(the test wrote the directive; no Airflow in this path)")  # fmt: skip


def test_a_standby_the_directive_does_not_name_is_stopped_and_the_directed_step_runs(launcher, clean_fp):
    """The orchestrator directs the attempt elsewhere than the supervisor predicted (its attribution left
    out another node than the alert's suspect): the standby, already waiting on the predicted nodes,
    never trains; the supervisor stops its srun step (SIGTERM through ft_launcher to the trainers) and
    starts the directed step fresh, with the same attempt's rendezvous; the run ends as a clean one."""
    run = tiny("hs-elsewhere", spare_nodes=1, drill=Drill(kind="nan", step=ALERT_STEP, target="1"))
    store = LocalDirStore(launcher.env["LONGRUN_STORE_DIR"])
    job_id = _submit(launcher, run, wait_s=180)
    client = launcher.client
    try:
        held = ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60).nodes
        (suspect,) = _first_alert(store, run.run_name)["suspect_nodes"]
        _wait("the standby", lambda: "standby: waiting" in _log(launcher, run.run_name, job_id))
        host = client.batch_host(job_id)
        other = next(n for n in held if n not in (suspect, host))
        nodes = tuple(n for n in held if n != other)
        ckpt = schema.store_key(run.run_name, schema.checkpoint_dir(PICK))
        log = _direct_and_finish(launcher, run.run_name, job_id, nodes=nodes, exclude=other)
        assert "stopping the standby (directed to" in log and "the standby is directed" not in log
    finally:
        if client.job(job_id).status in ACTIVE:
            client.cancel(job_id)
            ops.wait_for(client, job_id, lambda s: s.status not in ACTIVE, timeout_s=60)
    first, relaunch = _segments(store, run.run_name)  # the standby never wrote one: it never trained
    assert first.job_id == relaunch.job_id == str(job_id)
    assert (relaunch.start_step, relaunch.first_step, relaunch.resumed_from) == (PICK, PICK + 1, ckpt)
    assert other not in relaunch.nodes and sorted(set(relaunch.nodes)) == sorted(nodes)
    report = get_json(store, schema.store_key(run.run_name, schema.REPORT_PATH))
    assert report["final_fingerprint"] == clean_fp, "final weights differ from the clean run"


def test_no_directive_in_time_ends_the_job_with_93(launcher):
    run = tiny("hs-fallback", spare_nodes=1, drill=Drill(kind="nan", step=ALERT_STEP, target="1"))
    job_id = _submit(launcher, run, wait_s=5)
    final = ops.wait_for(launcher.client, job_id, lambda s: s.status not in ACTIVE, timeout_s=420, poll_s=1.0)
    log = _log(launcher, run.run_name, job_id)
    assert final.exit_code == schema.EXIT_SDC_VERDICT, final.describe() + log[-3000:]
    assert "stopping the standby (no directive in time)" in log and "no directive in time: exit 93" in log


def test_the_job_holds_its_spares(launcher):
    run = tiny("hs-spec", spare_nodes=1)
    tag = JobTag(dag_id="t", run_id="r", task_id="x")
    spec = job_spec_for_run(run, tag=tag, run_dir_root=str(launcher.root), env={}, python=sys.executable)
    assert spec.nodes == 4
    assert any(
        "-m training.spares.supervisor" in line and "--width 3 --spares 1" in line for line in spec.command
    )
    plain = job_spec_for_run(dataclasses.replace(run, spare_nodes=0), tag=tag, run_dir_root=str(launcher.root),
                             env={}, python=sys.executable)  # fmt: skip
    assert plain.nodes == 3 and not any("training.spares.supervisor" in line for line in plain.command)
    assert run_dir_for(run, str(launcher.root)).endswith("hs-spec")
