"""watch.look against a real Slurm job (the four-node test cluster) and a local-directory store: the
order of events (alert first, then checkpoints, then the job's end) and the stale heartbeat."""

from __future__ import annotations

import time

import pytest
from longrun.monitor import watch
from longrun.slurm import ops
from longrun.slurm.client import JobStatus, make_client
from longrun.slurm.spec import JobSpec

from training import schema
from training.store import LocalDirStore, put_json

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def test_look_orders_events_and_sees_a_stale_heartbeat(tmp_path, client):
    store = LocalDirStore(tmp_path / "store")
    spec = JobSpec(
        name="watch-test",
        partition="debug",
        command=("sleep 120",),
        comment="longrun/test/watch/look/-1/1",
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=5,
        workdir=str(tmp_path),
        output="watch-%j.out",
    )
    job_id = client.submit(spec)
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
