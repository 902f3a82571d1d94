"""watch.look against a real Slurm job (the four-node test cluster) and a local-directory store: the
order of events (alert first, then checkpoints, then the job's end), the stale heartbeat, and a job Slurm
holds after a failed launch (told apart from longrun's own requeue-hold)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest
from longrun.monitor import watch
from longrun.monitor.event import MonitorEvent
from longrun.slurm import ops
from longrun.slurm.errors import JobNotFoundError
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.outcomes import held_after_failed_launch
from longrun.slurm.spec import JobSpec, JobTag
from longrun.stack.slurm_conf import slurm_paths

from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def _spec(tmp_path, run: str, **kw) -> JobSpec:
    """A job as training_run submits one for `run`: named after the run, tagged by training_run."""
    return JobSpec(
        name=run,
        partition="debug",
        command=("sleep 120",),
        comment=JobTag(dag_id="training_run", run_id=f"test__{run}", task_id="submit").render(),
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=5,
        workdir=str(tmp_path),
        output="watch-%j.out",
        **kw,
    )


def test_look_orders_events_and_sees_a_stale_heartbeat(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    job_id = client.submit(_spec(tmp_path, "w1"))
    try:
        ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        # the watch began 100 s ago (a fresh watch gives a run its grace period)
        seen = watch.Seen(run="w1", job_id=job_id, stale_after_s=30, since=time.time() - 100)
        assert watch.look(store, client, seen)[0]["type"] == watch.STALE  # no progress at all for 100 s
        # progress that stopped moving 60 s ago while Slurm says RUNNING: stale
        put_json(store, schema.store_key("w1", schema.PROGRESS_PATH), schema.record(
            "progress", run="w1", step=5, loss=1.0, step_time_s=0.1, time=time.time() - 60))  # fmt: skip
        event, _ = watch.look(store, client, seen)
        assert event["type"] == watch.STALE and event["age_s"] >= 59
        # a manifest, then an alert: the alert comes first
        put_json(store, schema.store_key("w1", schema.manifest_path(10)), {"step": 10})
        alert = schema.record(
            "alert", run="w1", step=12, check="finite", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
        )
        key = schema.store_key("w1", schema.alert_path(12, "finite", "r001-1"))
        put_json(store, key, alert)
        event, _ = watch.look(store, client, seen)
        assert event["type"] == watch.ALERT and event["alert_key"] == key
        seen = watch.handled(seen, event)
        event, _ = watch.look(store, client, seen)
        assert event["type"] == watch.CHECKPOINT and event["step"] == 10
        seen = watch.handled(seen, event)
        client.cancel(job_id)
        ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
        event, _ = watch.look(store, client, seen)
        assert event["type"] == watch.JOB_DONE and event["label"] == "cancelled"
    finally:
        client.cancel(job_id)


@pytest.mark.parametrize("holder", ["another-name", "another-tag"])
def test_a_watched_id_that_names_another_job_ends_the_watch_as_lost(tmp_path, client, holder) -> None:
    """Slurm reuses job ids: a slurmctld that died before saving a job it had accepted gives the id to a
    later submission (the fault matrix saw the diagnosis probe's allocation take a relaunch's id). Here the
    watched id is simply another live job's: the look ends the watch as `job_lost` at once, and never
    reads that job's state as the run's (it would be "stale" here: it runs without the run's progress)."""
    store = LocalDirStore(tmp_path / "store")
    spec = _spec(tmp_path, "w5")
    if holder == "another-name":
        spec = dataclasses.replace(spec, name="someone-else")
    else:
        spec = dataclasses.replace(spec, comment="longrun/test/not/a-run-dag/-1/1")
    job_id = client.submit(spec)
    try:
        ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        seen = watch.Seen(run="w5", job_id=job_id, stale_after_s=30, since=time.time() - 100)
        event, _ = watch.look(store, client, seen)
        assert event is not None and event["type"] == watch.JOB_DONE, event
        assert event["label"] == watch.JOB_LOST and event["outcome"] == "terminal", event
        assert f"job {job_id}" in event["message"] and "the run's own job is gone" in event["message"]
        assert client.job(job_id).status is JobStatus.RUNNING  # looked at, never touched
    finally:
        client.cancel(job_id)


def test_a_watched_id_slurm_does_not_know_is_lost_after_the_grace_not_waited_on_forever(
    tmp_path, client
) -> None:
    """A job Slurm lost without giving its id away (a slurmctld that died before saving it), or one purged
    with no completion record: the look used to return nothing for it, look after look, so the watch
    waited until the task's timeout. Now: nothing during the grace (a slurmctld restarting under the
    look), then `job_lost`."""
    store = LocalDirStore(tmp_path / "store")
    never = 9_000_000  # far above any id the test cluster hands out
    with pytest.raises(JobNotFoundError):
        client.job(never)
    young = watch.Seen(run="w6", job_id=never, since=time.time())
    assert watch.look(store, client, young)[0] is None
    old = watch.Seen(run="w6", job_id=never, since=time.time() - watch.LOST_AFTER_S - 1)
    event, _ = watch.look(store, client, old)
    assert event is not None and event["type"] == watch.JOB_DONE and event["label"] == watch.JOB_LOST, event
    assert f"Slurm does not know job {never}" in event["message"] and event["state"] is None
    assert MonitorEvent.from_json({**event, "seen": watch.seen_to_dict(old)}).label == watch.JOB_LOST


def test_a_job_slurm_holds_after_a_failed_launch_fails_the_watch_and_longruns_own_hold_does_not(
    tmp_path, client, slurm_cluster
):
    """The chaos cell re-enter x slurmctld left a relaunch PENDING "launch failed requeued held" (slurmctld
    restarted just after the allocation; the node reported a duplicate job id) and the monitor waited
    forever. The same hold is made here through the stack's prolog hook: a failing prolog is the other
    way Slurm requeues a batch job held after its launch. longrun's own requeue-hold and an operator's
    hold must not be mistaken for it."""
    marker = slurm_paths(slurm_cluster.stack.layout)["fail_launch"] / "n3"
    env = {**os.environ, **slurm_cluster.env}
    jobs: list[int] = []
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    try:
        held_id = client.submit(_spec(tmp_path, "w2", nodelist=("n3",)))
        jobs.append(held_id)
        state = ops.wait_for(client, held_id, lambda s: s.held, timeout_s=120)
        assert state.slurm_state == "PENDING" and held_after_failed_launch(state), state
        seen = watch.Seen(run="w2", job_id=held_id, since=time.time())
        event, _ = watch.look(LocalDirStore(tmp_path / "store"), client, seen)
        assert event is not None and event["type"] == watch.LAUNCH_HELD, event
        assert f"job {held_id}" in event["message"] and "launch_failed_requeued_held" in event["message"]
        marker.unlink()

        # longrun's own hold (ops.requeue_excluding holds, then releases) and an operator's hold: waiting
        own_id = client.submit(_spec(tmp_path, "w3", nodelist=("n4",)))
        jobs.append(own_id)
        ops.wait_status(client, own_id, {JobStatus.RUNNING}, timeout_s=60)
        client.requeue_hold(own_id)
        own = ops.wait_for(client, own_id, lambda s: s.held, timeout_s=60)
        assert not held_after_failed_launch(own), own
        seen = watch.Seen(run="w3", job_id=own_id, since=time.time())
        assert watch.look(LocalDirStore(tmp_path / "store3"), client, seen)[0] is None
        # n3 is drained now (Slurm's "Prolog error"): a job for it pends, and an operator holds it
        op_id = client.submit(_spec(tmp_path, "w4", nodelist=("n3",)))
        jobs.append(op_id)
        subprocess.run(["scontrol", "hold", str(op_id)], env=env, check=True, capture_output=True)
        operator_hold = ops.wait_for(client, op_id, lambda s: s.held, timeout_s=60)
        assert not held_after_failed_launch(operator_hold), operator_hold
        seen = watch.Seen(run="w4", job_id=op_id, since=time.time())
        assert watch.look(LocalDirStore(tmp_path / "store4"), client, seen)[0] is None
    finally:
        marker.unlink(missing_ok=True)
        for job_id in jobs:
            client.cancel(job_id)
        for job_id in jobs:
            ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
        # Slurm drained n3 for the failed prolog ("Prolog error"): not longrun's reason, so resumed here
        subprocess.run(
            ["scontrol", "update", "NodeName=n3", "State=RESUME"], env=env, check=False, capture_output=True
        )
