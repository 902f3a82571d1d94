"""Outages are not hangs (issue 10 item 8), on the real SeaweedFS and Slurm.

While the store is stopped, the monitor's trigger keeps watching the running job with back-off and says
so in its log, instead of giving up after `max_errors` failed looks; when the store answers again the
heartbeat's stale clock restarts, so a job that trained through the outage is not called stale. The job
then ends and the trigger reports exactly that. Before: an `error` event after `max_errors` looks, or,
with a short outage, a `stale` event on the first look after it."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import boto3
import pytest
from botocore.config import Config
from longrun.monitor import watch
from longrun.monitor.trigger import RunMonitorTrigger
from longrun.slurm.factory import make_client
from longrun.slurm.spec import JobSpec, JobTag

from training.records import schema
from training.store.interface import StoreUnavailable, put_json
from training.store.s3 import S3Store

pytestmark = [pytest.mark.slurm, pytest.mark.s3, pytest.mark.slow]

OUTAGE_S = 12.0
STALE_AFTER_S = 6.0  # shorter than the outage: the old heartbeat would be "stale" right after it


def test_the_monitor_watches_through_a_store_outage(
    local_stack, slurm_cluster, s3_store_env, monkeypatch, tmp_path, caplog, capfd
) -> None:
    for k, v in {**s3_store_env, **slurm_cluster.env}.items():
        monkeypatch.setenv(k, v)
    run = f"outage-{uuid.uuid4().hex[:6]}"
    finish = tmp_path / "finish"
    # The stand-in trainer's heartbeat gives up on one failed attempt within seconds and beats again a second
    # later. With the store's default client (6 attempts with jittered back-off, up to ~30 s in all, and a
    # 60 s read timeout) a write begun during the outage can still be waiting well after the store is back,
    # longer than the stale clock here: the monitor then rightly calls the job stale (a CI run saw exactly
    # that), and the test would measure botocore's back-off instead of the monitor. Progress is on the job's
    # side of the store, its own bucket.
    quick = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_store_env["AWS_ENDPOINT_URL"],
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=3),
    )
    heartbeat_store = S3Store(
        bucket=s3_store_env["LONGRUN_BUCKET"], endpoint_url=s3_store_env["AWS_ENDPOINT_URL"], client=quick
    )
    client = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    job = client.submit(
        JobSpec(
            name=run,
            partition=slurm_cluster.partition,
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=5,
            workdir=str(tmp_path),
            output=f"{tmp_path}/slurm-%j.out",
            comment=JobTag(dag_id="training_run", run_id=f"test__{run}", task_id="submit").render(),
            command=[f"while [ ! -e {finish} ]; do sleep 0.2; done"],  # ends when the test says
        )
    )
    key = schema.store_key(run, schema.PROGRESS_PATH)

    def heartbeat(step: int) -> None:
        put_json(
            heartbeat_store, key, schema.record("progress", run=run, step=step, loss=1.0, step_time_s=0.1)
        )

    heartbeat(1)
    seen = watch.Seen(run=run, job_id=job, stale_after_s=STALE_AFTER_S, since=time.time())
    trigger = RunMonitorTrigger(
        seen=watch.seen_to_dict(seen),
        slurm_conf=slurm_cluster.env["SLURM_CONF"],
        poll_s=0.5,
        max_poll_s=2.0,
        max_errors=2,  # Slurm hiccups still count; store outages must not
    )
    say: list[str] = []
    logs: list[str] = []  # the trigger logs through Airflow's structlog (stderr), not caplog

    def logged() -> str:
        out, err = capfd.readouterr()
        logs.append(out + err)
        return caplog.text + "".join(logs)

    async def main() -> dict[str, Any]:
        async def outage() -> None:
            # The trainer's heartbeat until the store stops (a single old one could turn stale on a slow host).
            for step in (2, 3):
                await asyncio.sleep(1.0)
                await asyncio.to_thread(heartbeat, step)
            await asyncio.to_thread(local_stack.s3.down, say.append)
            await asyncio.sleep(OUTAGE_S)
            # The store restarts while the trainer beats on (it trains through the outage), so a heartbeat
            # lands as soon as the store answers. Not after `up` returns: `up` waits for more than the
            # store answering, and once the monitor has found the store its stale clock runs (a CI run
            # called the job stale 6 s later, `up` still busy). The job ends once the monitor has found
            # the store again: in that order, however long each part took.
            restart = asyncio.ensure_future(asyncio.to_thread(local_stack.s3.up, say.append))
            for step in range(4, 400):
                try:
                    await asyncio.to_thread(heartbeat, step)
                except StoreUnavailable:
                    pass  # lost, as a trainer's heartbeat is while the store is down
                if "store reachable again" in logged():
                    finish.touch()
                await asyncio.sleep(1.0)
            await restart

        cut = asyncio.create_task(outage())
        try:
            async for event in trigger.run():
                return event.payload
            raise AssertionError("the trigger ended without an event")
        finally:
            cut.cancel()

    caplog.set_level(logging.WARNING)
    try:
        payload = asyncio.run(asyncio.wait_for(main(), 180))
    finally:
        if not local_stack.s3.all_alive():
            local_stack.s3.up(say.append)
        client.cancel(job)
    assert payload["type"] == watch.JOB_DONE, payload
    assert payload["outcome"] == "success", payload
    text = logged()
    assert "store unreachable for" in text and "still watching" in text, text[-2000:]
    assert "store reachable again" in text, text[-2000:]
