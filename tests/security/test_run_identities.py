"""Per-run job credentials (issue 28, item 2) on the real SeaweedFS of the session's stack.

A job gets its store keys at submit from `alert_auth.submit_env`, the launch path's own function. Before,
those were the keys of the one shared job identity (`longrun-job`), which may read, write and list the
whole job bucket: a job of run A overwrote, deleted and read run B's records and checkpoints (the first
test shows it still can with that identity). Now the orchestrator creates an identity for each run
(`longrun.run_identity`, through SeaweedFS's IAM API with its Admin keys) whose policy names only
`runs/<run>/`, and removes it when the run ends (the monitor at the job's end; the incident's summary when
it did not relaunch). Each attack below is made with the keys a job receives.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException
from botocore.config import Config
from botocore.exceptions import ClientError
from longrun import alert_auth
from longrun.incident import runner
from longrun.monitor.operator import RunMonitorOperator
from longrun.run_identity import (
    IDENTITY_PREFIX,
    RunIdentityError,
    SeaweedRunIdentities,
    identities_from_env,
    identity_name,
    run_policy,
)
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.spec import JobSpec, JobTag
from longrun.store_access import job_store_env
from longrun.tasks.sdc_incident import end_run_identity

from training.records import schema
from training.store.interface import ObjectStore, StoreAuthError, get_json, put_json
from training.store.local import LocalDirStore
from training.store.s3 import S3Store
from training.store.sides import SidedStore

pytestmark = pytest.mark.s3


def _client(service: str, env: dict[str, str], key_id: str, secret: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        region_name=env["AWS_DEFAULT_REGION"],
        config=Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=10),
    )


def _store(env: dict[str, str], key_id: str, secret: str) -> SidedStore:
    """The two-sided store as a holder of these keys sees it (the job's `store_from_env`, keys explicit)."""
    s3 = _client("s3", env, key_id, secret)
    endpoint = env["AWS_ENDPOINT_URL"]
    return SidedStore(
        job=S3Store(bucket=env["LONGRUN_BUCKET"], endpoint_url=endpoint, max_attempts=1, client=s3),
        orchestrator=S3Store(
            bucket=env["LONGRUN_ORCH_BUCKET"], endpoint_url=endpoint, max_attempts=1, client=s3
        ),
    )


def _tag(run: str, try_number: int = 1) -> str:
    return JobTag(
        dag_id="training_run", run_id=f"test__{run}", task_id="submit", try_number=try_number
    ).render()


def _job_keys(orch: ObjectStore, env: dict[str, str], run: str, try_number: int = 1) -> tuple[str, str]:
    """The store keys the launch path hands the job of `run` (what sbatch's environment gets)."""
    secrets = alert_auth.submit_env(orch, run=run, tag=_tag(run, try_number), env=env)
    return secrets["AWS_ACCESS_KEY_ID"], secrets["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture
def world(s3_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The orchestrator's environment and store, and two fresh runs A and B; both runs' identities are
    removed at the end (the stack is left as it was)."""
    env = dict(s3_store_env)
    assert env.get("LONGRUN_RUN_IDENTITIES") == "seaweedfs", "the stack hands out per-run identities"
    for k, v in env.items():  # the orchestrator's process environment (the monitor reads it)
        monkeypatch.setenv(k, v)
    orch = _store(env, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    a, b = (f"ri{x}-{uuid.uuid4().hex[:8]}" for x in "ab")
    try:
        yield {"env": env, "orch": orch, "a": a, "b": b}
    finally:
        for run in (a, b):
            SeaweedRunIdentities(env).revoke(run)


def _records_of(orch: ObjectStore, run: str) -> dict[str, str]:
    """Write a run's job-side records and a directive as its job and the orchestrator would; their keys."""
    keys = {
        "progress": schema.store_key(run, schema.PROGRESS_PATH),
        "alert": schema.store_key(run, schema.alert_path(7, "finite", "r001-0")),
        "checkpoint": schema.store_key(run, schema.checkpoint_dir(10) + "model.pt"),
        "directive": schema.store_key(run, "directives/00000001.json"),
    }
    put_json(orch, keys["progress"], {"step": 3, "run": run})
    put_json(orch, keys["alert"], {"run": run, "genuine": True})
    orch.put_bytes(keys["checkpoint"], b"weights of " + run.encode())
    put_json(orch, keys["directive"], {"attempt": 1, "run": run})
    return keys


def _attack(job: SidedStore, other: dict[str, str]) -> list[str]:
    """Every way a job reaches another run's records (reads first, the delete last); the ones that went
    through."""
    went_through = []
    attempts = {
        "read progress": lambda: job.get_bytes(other["progress"]),
        "read the checkpoint": lambda: job.get_bytes(other["checkpoint"]),
        "read the directive": lambda: job.get_bytes(other["directive"]),
        "list the run": lambda: list(job.job.list(other["progress"].rsplit("/", 2)[0] + "/")),
        "list the bucket": lambda: list(job.job.list("")),
        "overwrite progress": lambda: job.put_bytes(other["progress"], b'{"step": 999}'),
        "plant an alert": lambda: job.put_bytes(other["alert"].replace("r001-0", "r002-9"), b"{}"),
        "overwrite the checkpoint": lambda: job.put_bytes(other["checkpoint"], b"poison"),
        "delete the checkpoint": lambda: job.delete(other["checkpoint"]),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
        except StoreAuthError:
            continue
        went_through.append(what)
    return went_through


def _intact(orch: SidedStore, run: str, keys: dict[str, str]) -> None:
    assert get_json(orch, keys["progress"]) == {"step": 3, "run": run}
    assert orch.get_bytes(keys["checkpoint"]) == b"weights of " + run.encode()
    assert [i.key for i in orch.job.list(schema.store_key(run, "alerts/"))] == [keys["alert"]]


def test_the_shared_job_identity_reaches_every_run(world) -> None:
    """What the launch path handed out before: the shared identity (still the one `job_store_env` names)
    writes, deletes, reads and lists another run's records. Kept to show the hole the per-run identity
    closes, on the same stack."""
    env, orch, b = world["env"], world["orch"], world["b"]
    shared = job_store_env(env)
    keys = _records_of(orch, b)
    job = _store(env, shared["AWS_ACCESS_KEY_ID"], shared["AWS_SECRET_ACCESS_KEY"])
    assert _attack(job, keys) == [
        "read progress",
        "read the checkpoint",
        "read the directive",
        "list the run",
        "list the bucket",
        "overwrite progress",
        "plant an alert",
        "overwrite the checkpoint",
        "delete the checkpoint",
    ]
    assert get_json(orch, keys["progress"]) == {"step": 999}


def test_a_runs_job_reaches_its_own_run_and_nothing_of_another(world) -> None:
    """With the keys the launch path hands run A's job: A's records, checkpoints and directives as the
    job uses them, and every attack on run B's refused (AccessDenied), B's records intact. Before (the
    shared identity's keys from the same call) every attack went through."""
    env, orch, a, b = world["env"], world["orch"], world["a"], world["b"]
    key_id, secret = _job_keys(orch, env, a)
    job = _store(env, key_id, secret)
    own = _records_of(orch, a)
    put_json(job, own["progress"], {"step": 4, "run": a})
    job.put_bytes(own["checkpoint"], b"new weights")
    job.delete(own["checkpoint"])
    assert get_json(job, own["alert"]) == {"run": a, "genuine": True}
    assert get_json(job, own["directive"]) == {"attempt": 1, "run": a}
    assert [i.key for i in job.list(schema.store_key(a, "alerts/"))] == [own["alert"]]
    assert [i.key for i in job.list(schema.store_key(a, "directives/"))] == [own["directive"]]
    with pytest.raises(StoreAuthError):
        job.put_bytes(own["directive"], b'{"attempt": 99}')  # its directives: read, never written
    with pytest.raises(StoreAuthError):
        job.get_bytes(schema.store_key(a, schema.PROMOTED_POINTER_PATH))  # nor the rest of its orch side

    others = _records_of(orch, b)
    assert _attack(job, others) == []
    _intact(orch, b, others)
    assert key_id not in (env["AWS_ACCESS_KEY_ID"], env["LONGRUN_JOB_ACCESS_KEY_ID"])
    assert SeaweedRunIdentities(env).key_ids(a) == [key_id]


def test_a_job_identity_cannot_call_the_iam_api(world) -> None:
    """The IAM API answers writes on the S3 port now, but only the Admin identity may create users, set
    policies or touch another user's keys: neither a run's identity nor the shared job identity can make
    users, widen its own policy, attach one, mint keys for someone else, or delete another run's identity.
    What SeaweedFS lets every identity do (AWS's self-service) is create and delete keys of its own:
    same scope, removed with the identity (`test_when_the_run_ends_its_keys_stop_working`)."""
    env, orch, a, b = world["env"], world["orch"], world["a"], world["b"]
    a_keys = _job_keys(orch, env, a)
    _job_keys(orch, env, b)
    everything = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*", "iam:*"], "Resource": "*"}],
        }
    )
    shared = (env["LONGRUN_JOB_ACCESS_KEY_ID"], env["LONGRUN_JOB_SECRET_ACCESS_KEY"])
    for holder, keys in (("run A's identity", a_keys), ("the shared job identity", shared)):
        iam = _client("iam", env, *keys)
        calls = {
            "ListUsers": lambda iam=iam: iam.list_users(),
            "CreateUser": lambda iam=iam: iam.create_user(UserName=IDENTITY_PREFIX + "evil"),
            "PutUserPolicy on run A's identity": lambda iam=iam: iam.put_user_policy(
                UserName=identity_name(a), PolicyName="more", PolicyDocument=everything
            ),
            "CreatePolicy": lambda iam=iam: iam.create_policy(PolicyName="more", PolicyDocument=everything),
            "AttachUserPolicy": lambda iam=iam: iam.attach_user_policy(
                UserName=identity_name(a), PolicyArn="arn:aws:iam:::policy/more"
            ),
            "CreateAccessKey for run B": lambda iam=iam: iam.create_access_key(UserName=identity_name(b)),
            "CreateAccessKey for the orchestrator": lambda iam=iam: iam.create_access_key(UserName="longrun"),
            "DeleteUser run B": lambda iam=iam: iam.delete_user(UserName=identity_name(b)),
            "UpdateUser (rename itself)": lambda iam=iam: iam.update_user(
                UserName=identity_name(a), NewUserName="longrun"
            ),
            "GetUser of the orchestrator": lambda iam=iam: iam.get_user(UserName="longrun"),
        }
        for what, call in calls.items():
            with pytest.raises(ClientError) as refused:
                call()
            status = refused.value.response["ResponseMetadata"]["HTTPStatusCode"]
            assert status == 403, f"{holder}: {what} answered {status}: {refused.value}"
    admin = _client("iam", env, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    users = {u["UserName"] for u in admin.list_users()["Users"]}
    assert IDENTITY_PREFIX + "evil" not in users and {identity_name(a), identity_name(b)} <= users
    assert len(SeaweedRunIdentities(env).key_ids(b)) == 1
    policy = admin.get_user_policy(UserName=identity_name(a), PolicyName="longrun-run")["PolicyDocument"]
    assert policy == run_policy(a, job_bucket=env["LONGRUN_BUCKET"], orch_bucket=env["LONGRUN_ORCH_BUCKET"])
    assert _attack(_store(env, *a_keys), _records_of(orch, b)) == []  # nothing it tried widened it


def _job_done(run: str, outcome: str) -> dict[str, Any]:
    """The trigger's job_done event for `run`'s job, as it sends it."""
    return {
        "type": "job_done",
        "outcome": outcome,
        "label": "completed" if outcome == "success" else "failed",
        "message": "COMPLETED (exit 0)" if outcome == "success" else "FAILED (exit 1)",
        "state": {"job_id": 42, "status": "COMPLETED" if outcome == "success" else "FAILED", "exit_code": 0},
        "seen": {"run": run, "job_id": 42, "steps": [], "alerts": [], "stale_after_s": 600.0, "since": 1.0},
        "carry": {"promoted": [], "rejected": []},
        "at": 2.0,
    }


@pytest.mark.parametrize("outcome", ["success", "failed"])
def test_when_the_run_ends_its_keys_stop_working(world, tmp_path, outcome: str) -> None:
    """The monitor sees the run's job end (done, or failed) and the run's identity goes: the key the job
    got, and one it made for itself, are refused from then on. Removing it again is a no-op. Before, the
    job's keys (the shared identity's) outlived every run."""
    env, orch, a = world["env"], world["orch"], world["a"]
    key_id, secret = _job_keys(orch, env, a)
    own = schema.store_key(a, schema.PROGRESS_PATH)
    put_json(_store(env, key_id, secret), own, {"step": 1})
    minted = _client("iam", env, key_id, secret).create_access_key()["AccessKey"]
    second = (minted["AccessKeyId"], minted["SecretAccessKey"])
    put_json(_store(env, *second), own, {"step": 2})  # its own key: the same scope
    assert _attack(_store(env, *second), _records_of(orch, world["b"])) == []

    monitor = RunMonitorOperator(task_id="monitor", run_name=a, job_id=42)
    monitor.__dict__["store"] = LocalDirStore(tmp_path)  # the cached_property: no checkpoints to report
    if outcome == "success":
        assert (
            monitor.execute_complete({"run_id": "manual__1"}, _job_done(a, outcome))["outcome"] == "completed"
        )
    else:
        with pytest.raises(AirflowFailException, match="Slurm job ended FAILED"):
            monitor.execute_complete({"run_id": "manual__1"}, _job_done(a, outcome))

    for keys in ((key_id, secret), second):
        with pytest.raises(StoreAuthError):
            put_json(_store(env, *keys), own, {"step": 3})
        with pytest.raises(StoreAuthError):
            _store(env, *keys).get_bytes(own)
    assert SeaweedRunIdentities(env).key_ids(a) == []
    assert identities_from_env(env).revoke(a) is False  # already gone: nothing to do, no error
    assert get_json(orch, own) == {"step": 2}


def test_a_retried_submit_leaves_one_identity_with_one_key(world) -> None:
    """Each try of the submit (and a relaunch of the run) asks again: still one identity, one key, the
    latest; the earlier try's key is refused."""
    env, orch, a = world["env"], world["orch"], world["a"]
    first = _job_keys(orch, env, a, try_number=1)
    second = _job_keys(orch, env, a, try_number=2)
    assert first != second
    admin = _client("iam", env, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    named = [u["UserName"] for u in admin.list_users()["Users"] if u["UserName"] == identity_name(a)]
    assert named == [identity_name(a)]
    assert SeaweedRunIdentities(env).key_ids(a) == [second[0]]
    own = schema.store_key(a, schema.PROGRESS_PATH)
    put_json(_store(env, *second), own, {"step": 1})
    with pytest.raises(StoreAuthError):
        put_json(_store(env, *first), own, {"step": 0})


def test_an_incident_that_did_not_relaunch_ends_the_runs_identity_once_its_job_is_gone(
    world, slurm_cluster, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incident's summary, when nothing was relaunched: while the alerting job still runs its identity
    stays (its uploads are not cut off); once the job has ended the identity goes."""
    env, orch, a = world["env"], world["orch"], world["a"]
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])  # what SlurmHook() falls back to
    key_id, secret = _job_keys(orch, env, a)
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    spec = JobSpec(
        name=a,
        partition=slurm_cluster.partition,
        comment=_tag(a),
        nodes=1,
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=5,
        workdir=str(tmp_path),
        output=f"{tmp_path}/slurm-%j.out",
        command=("sleep 300",),
    )
    job_id = client.submit(spec)
    try:
        deadline = time.monotonic() + 60
        while not client.job(job_id).is_active and time.monotonic() < deadline:
            time.sleep(0.3)
        alert = schema.record(
            "alert", run=a, step=7, check="finite", suspect_ranks=[0], suspect_nodes=["n1"], evidence={}
        )
        inc = runner.Incident(
            run=a,
            alert_key=schema.store_key(a, schema.alert_path(7, "finite", "r000-0")),
            alert=alert,
            job_id=job_id,
            run_params={"run_name": a, "nodes": 1, "gpus_per_node": 0, "incident_mode": "observe"},
        )
        end_run_identity(inc)
        assert SeaweedRunIdentities(env).key_ids(a) == [key_id], "the job still runs: its keys stay"
    finally:
        client.cancel(job_id)
    deadline = time.monotonic() + 60
    while not client.job(job_id).is_terminal and time.monotonic() < deadline:
        time.sleep(0.3)
    end_run_identity(inc)
    assert SeaweedRunIdentities(env).key_ids(a) == []
    with pytest.raises(StoreAuthError):
        put_json(_store(env, key_id, secret), schema.store_key(a, schema.PROGRESS_PATH), {"step": 1})


# ---- no server needed --------------------------------------------------------------------------------


def test_the_policy_names_only_the_runs_prefix() -> None:
    policy = run_policy("r1", job_bucket="jb", orch_bucket="ob")
    resources = [s["Resource"] for s in policy["Statement"]]
    assert resources == [
        "arn:aws:s3:::jb/runs/r1/*",
        "arn:aws:s3:::jb",
        "arn:aws:s3:::ob/runs/r1/directives/*",
        "arn:aws:s3:::ob",
    ]
    prefixes = [s["Condition"]["StringLike"]["s3:prefix"] for s in policy["Statement"] if "Condition" in s]
    assert prefixes == ["runs/r1/*", "runs/r1/directives/*"]
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    for bad in ("*", "r1/../r2", "", "r*", "a?b"):
        with pytest.raises(ValueError):
            run_policy(bad, job_bucket="jb", orch_bucket="ob")
        with pytest.raises(ValueError):
            identity_name(bad)


def test_without_the_setting_every_job_gets_the_shared_identity() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ACCESS_KEY_ID": "ORCH",
        "AWS_SECRET_ACCESS_KEY": "orch-secret",
        "LONGRUN_BUCKET": "b",
        "LONGRUN_ORCH_BUCKET": "b-orchestrator",
        "LONGRUN_JOB_ACCESS_KEY_ID": "JOB",
        "LONGRUN_JOB_SECRET_ACCESS_KEY": "job-secret",
    }
    shared = identities_from_env(env)
    assert shared.issue("r1") == job_store_env(env) and shared.revoke("r1") is False
    with pytest.raises(RunIdentityError, match="not one of"):
        identities_from_env({**env, "LONGRUN_RUN_IDENTITIES": "aws"})
    with pytest.raises(RunIdentityError, match="LONGRUN_ORCH_BUCKET"):
        identities_from_env({**env, "LONGRUN_RUN_IDENTITIES": "seaweedfs", "LONGRUN_ORCH_BUCKET": ""})


def test_the_aws_session_policy_in_the_docs_is_the_one_the_code_writes() -> None:
    """docs/security.md prints the session policy a site on AWS gives each run: the same document SeaweedFS
    enforces here, with the placeholders in place of the names."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    block = text.split("Session policy of run `<run>`:", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    code = json.dumps(run_policy("xrunx", job_bucket="xbucketx", orch_bucket="xorchx"))
    code = code.replace("xrunx", "<run>").replace("xbucketx", "<bucket>").replace("xorchx", "<orch-bucket>")
    assert json.loads(block) == json.loads(code)
