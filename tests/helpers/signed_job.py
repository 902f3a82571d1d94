"""A longrun-tagged job on the real test cluster that receives its alert key the way a training job does
(`alert_auth.submit_env` + `--export`), signs an alert with the trainer's EventWriter in a job step,
writes a step's environment to a file and then sleeps: the subject of the trust-boundary tests.

Submitted as the orchestrator does it; cancelled by the caller (by job id) at teardown.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrun import alert_auth
from longrun.launch import JOB_EXPORT
from longrun.slurm.client import SlurmClient
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from longrun.store_access import job_store_env

from training.records import schema
from training.store.interface import ObjectStore


@dataclass(frozen=True, slots=True)
class SignedJob:
    job_id: int
    run: str
    tag: str
    nodes: tuple[str, ...]
    env_file: Path
    alert_key: str
    """Store key of the alert the job signed and wrote."""
    alert: dict[str, Any]


def _alert_code(run: str, run_dir: Path, suspect: str) -> str:
    return (
        "from pathlib import Path;from training.records import schema;from training.events import EventWriter;"
        "from training.store.factory import store_from_env;"
        f"w=EventWriter(run={run!r},run_dir=Path({str(run_dir)!r}),store=store_from_env(),rank=0,"
        "flush_every=1,progress_interval_s=1.0);"
        f"w.alert(schema.record('alert',run={run!r},step=7,check='recompute',suspect_ranks=[1],"
        f"suspect_nodes=[{suspect!r}],evidence={{'world':{{'world_size':2}}}}))"
    )


def submit_signed_job(
    client: SlurmClient,
    store: ObjectStore,
    *,
    run: str,
    orch_env: Mapping[str, str],
    workdir: Path,
    partition: str,
    nodelist: tuple[str, ...] = ("n1", "n2"),
    suspect: str = "n2",
    timeout_s: float = 90.0,
) -> SignedJob:
    """Submit, wait until the job runs and its signed alert is in the store (bounded)."""
    tag = JobTag(dag_id="training_run", run_id=f"test__{run}", task_id="submit").render()
    plain = {k: v for k, v in job_store_env(orch_env).items() if k not in alert_auth.SECRET_STORE_ENV}
    env_file = workdir / f"{run}.env"
    spec = JobSpec(
        name=run,
        partition=partition,
        comment=tag,
        nodes=len(nodelist),
        nodelist=nodelist,
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=10,
        workdir=str(workdir),
        output=f"{workdir}/slurm-%j.out",
        env=plain,
        export=JOB_EXPORT,
        command=(
            # Both through a job step, as the trainer runs: what a rank sees.
            f"srun --ntasks=1 --nodes=1 env > {shlex.quote(str(env_file))}",
            f"srun --ntasks=1 --nodes=1 {shlex.quote(sys.executable)} -c"
            f" {shlex.quote(_alert_code(run, workdir / run, suspect))}",
            "sleep 600",
        ),
    )
    secrets = alert_auth.submit_env(store, run=run, tag=tag, env=orch_env)
    job_id = client.submit(spec, secret_env=secrets)
    alert_auth.bind(store, run=run, tag=tag, job_id=job_id)
    prefix = schema.store_key(run, "alerts/")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = client.job(job_id)
        keys = [o.key for o in store.list(prefix)]
        if keys and state.status is JobStatus.RUNNING:
            return SignedJob(
                job_id=job_id,
                run=run,
                tag=tag,
                nodes=tuple(state.nodes),
                env_file=env_file,
                alert_key=keys[0],
                alert=json.loads(store.get_bytes(keys[0])),
            )
        if state.is_terminal:
            out = (workdir / f"slurm-{job_id}.out").read_text(errors="replace")[-2000:]
            raise AssertionError(f"signed job {job_id} ended {state.describe()} before its alert: {out}")
        time.sleep(0.5)
    client.cancel(job_id)
    raise AssertionError(f"no signed alert from job {job_id} within {timeout_s} s")


def keyed_job(
    client: SlurmClient,
    store: ObjectStore,
    *,
    run: str,
    nodelist: tuple[str, ...],
    workdir: Path,
    partition: str,
    timeout_s: float = 60.0,
    command: tuple[str, ...] = ("true",),
) -> tuple[int, bytes]:
    """A longrun-tagged job of `run` (submitted by `training_run` DAG run `test__<run>`) with an issued
    alert key that has already ended (Slurm still lists its allocation): (job id, key), for signing an
    alert in the test as the job would have. `command`: what the job ran (its script's lines)."""
    tag = JobTag(dag_id="training_run", run_id=f"test__{run}", task_id="submit").render()
    spec = JobSpec(
        name=run,
        partition=partition,
        comment=tag,
        nodes=len(nodelist),
        nodelist=nodelist,
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=5,
        workdir=str(workdir),
        output=f"{workdir}/slurm-%j.out",
        command=command,
    )
    key = alert_auth.issue(store, run=run, tag=tag)
    job_id = client.submit(spec)
    alert_auth.bind(store, run=run, tag=tag, job_id=job_id)
    deadline = time.monotonic() + timeout_s
    while not client.job(job_id).is_terminal:
        if time.monotonic() > deadline:
            client.cancel(job_id)
            raise AssertionError(f"keyed job {job_id} did not end within {timeout_s} s")
        time.sleep(0.3)
    return job_id, key


def sign_as_job(alert: Mapping[str, Any], *, job_id: int, key: bytes) -> dict[str, Any]:
    """`alert` as the job's EventWriter writes it: with its job id, signed with its key."""
    from training.records import signing

    return signing.sign({**alert, "job_id": job_id}, key)
