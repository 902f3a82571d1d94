"""After gating a checkpoint the monitor looks once more from the worker (`RunMonitorOperator._look_now`):
what the trigger would fire next (a further checkpoint, the job's end) is handled in the same try, and
only a job that still runs, or a look that fails, sends the watch back to the trigger. Real Slurm jobs
(the test cluster), real checkpoints (CheckpointSaver) in a local-directory store, real validation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from airflow.sdk.exceptions import TaskDeferred
from longrun.checkpoints.catalog import promoted_steps
from longrun.monitor import watch
from longrun.monitor.event import Carry
from longrun.monitor.operator import CHECKPOINTS_ALIAS, RunMonitorOperator
from longrun.monitor.trigger import RunMonitorTrigger, event_json
from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag

from training.checkpoint.saver import CheckpointSaver
from training.checkpoint.settings import SaverSettings
from training.records import schema
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm]
RUN = "inline1"


class Events:
    """What `context["outlet_events"][alias]` offers the operator: `add(asset, extra=...)`, recorded."""

    def __init__(self) -> None:
        self.added: list[dict] = []

    def add(self, asset: object, extra: dict) -> None:
        self.added.append(extra)


def context() -> dict:
    events = Events()
    return {"run_id": "manual__inline", "outlet_events": {CHECKPOINTS_ALIAS: events}, "events": events}


def save(store: ObjectStore, run_dir: Path, steps: list[int]) -> None:
    with CheckpointSaver(
        run=RUN, run_dir=run_dir, store=store, settings=SaverSettings(writer="thread", wait_timeout_s=120)
    ) as saver:
        for step in steps:
            torch.manual_seed(step)
            model = torch.nn.Linear(4, 2)
            saver.save(
                step=step,
                model_state=model.state_dict(),
                optim_state={},
                extra={"rng": torch.get_rng_state()},
                manifest_fields={"coverage": {}, "loss": 1.0 / step},
            )
        assert saver.wait(120) and saver.last_error is None, saver.last_error


def job(client: SlurmClient, tmp_path: Path, command: str) -> int:
    return client.submit(
        JobSpec(
            name=RUN,
            partition="debug",
            command=(command,),
            comment=JobTag(dag_id="training_run", run_id=f"test__{RUN}", task_id="submit").render(),
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=5,
            workdir=str(tmp_path),
            output="inline-%j.out",
        )
    )


def operator(store: ObjectStore, client: SlurmClient, slurm_conf: str, job_id: int) -> RunMonitorOperator:
    op = RunMonitorOperator(task_id="monitor", run_name=RUN, job_id=job_id)
    op.__dict__["store"] = store  # the cached properties: this test's store and the test cluster
    op.__dict__["hook"] = SimpleNamespace(
        client=client, trigger_kwargs=lambda: {"slurm_conf": slurm_conf, "backend": "cli"}
    )
    return op


def first_event(store: ObjectStore, client: SlurmClient, seen: watch.Seen) -> dict:
    fields, _ = watch.look(store, client, seen)
    assert fields is not None and fields["type"] == watch.CHECKPOINT, fields
    return event_json(fields, seen, Carry())


@pytest.fixture
def conf(slurm_cluster) -> str:
    return slurm_cluster.env["SLURM_CONF"]


def test_checkpoints_and_the_end_of_a_finished_job_are_handled_in_one_try(tmp_path, conf) -> None:
    client = make_client(backend="cli", slurm_conf=conf)
    store = LocalDirStore(tmp_path / "store")
    save(store, tmp_path / "run", [10, 20, 30])
    # step 20's model shard is damaged: validation must refuse it, and the watch still goes on
    shard = next(p for p in store.list(schema.store_key(RUN, "checkpoints/")) if "step-00000020" in p.key
                 and not p.key.endswith("manifest.json"))  # fmt: skip
    store.put_bytes(shard.key, b"not the bytes the manifest hashed")
    job_id = job(client, tmp_path, "true")
    ops.wait_status(client, job_id, {JobStatus.COMPLETED}, timeout_s=120)
    seen = watch.Seen(run=RUN, job_id=job_id)
    ctx = context()
    out = operator(store, client, conf, job_id).execute_complete(ctx, first_event(store, client, seen))
    assert out["outcome"] == "completed" and out["state"]["slurm_state"] == "COMPLETED", out
    assert [r["step"] for r in out["promoted"]] == [10, 30]
    assert all(r["validated"] for r in out["promoted"])
    assert [(r["step"], r["validated"]) for r in out["rejected"]] == [(20, False)]
    assert promoted_steps(store, RUN) == [10, 30]
    assert [e["step"] for e in ctx["events"].added] == [10, 30]  # the watch's asset events, at its end


def test_a_job_that_still_runs_goes_back_to_the_trigger(tmp_path, conf) -> None:
    client = make_client(backend="cli", slurm_conf=conf)
    store = LocalDirStore(tmp_path / "store")
    save(store, tmp_path / "run", [10])
    job_id = job(client, tmp_path, "sleep 120")
    try:
        ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        seen = watch.Seen(run=RUN, job_id=job_id)
        op = operator(store, client, conf, job_id)
        with pytest.raises(TaskDeferred) as deferred:
            op.execute_complete(context(), first_event(store, client, seen))
        trigger = deferred.value.trigger
        assert isinstance(trigger, RunMonitorTrigger)
        assert trigger.seen["steps"] == [10] and [r["step"] for r in trigger.carry["promoted"]] == [10]
        assert promoted_steps(store, RUN) == [10]
    finally:
        client.cancel(job_id)


def test_a_look_that_fails_goes_back_to_the_trigger(tmp_path, conf) -> None:
    client = make_client(backend="cli", slurm_conf=conf)
    store = LocalDirStore(tmp_path / "store")
    save(store, tmp_path / "run", [10, 20])
    job_id = job(client, tmp_path, "true")
    ops.wait_status(client, job_id, {JobStatus.COMPLETED}, timeout_s=120)
    seen = watch.Seen(run=RUN, job_id=job_id)
    event = first_event(store, client, seen)
    # the worker's Slurm commands fail (a configuration file they cannot parse)
    bad_conf = tmp_path / "broken-slurm.conf"
    bad_conf.write_text("this is not a slurm.conf\n")
    broken = make_client(backend="cli", slurm_conf=str(bad_conf))
    with pytest.raises(TaskDeferred) as deferred:
        operator(store, broken, conf, job_id).execute_complete(context(), event)
    assert deferred.value.trigger.seen["steps"] == [10]  # step 20 and the job's end: the trigger's
    assert promoted_steps(store, RUN) == [10]
