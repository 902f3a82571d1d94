"""The session's Slurm cluster and S3 store answer like the real things they are."""

from __future__ import annotations

import subprocess
import time
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from helpers.stack_fixtures import SlurmCluster


@pytest.mark.slurm
def test_three_node_job(slurm_cluster: SlurmCluster) -> None:
    out = subprocess.run(
        [
            "srun",
            "-N3",
            "--ntasks-per-node=1",
            f"--partition={slurm_cluster.partition}",
            "bash",
            "-c",
            "echo $SLURMD_NODENAME",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_cluster.client_env(),
    )
    assert out.returncode == 0, out.stderr
    nodes = sorted(out.stdout.split())
    assert len(nodes) == 3 and len(set(nodes)) == 3
    assert set(nodes) <= set(slurm_cluster.nodes)


@pytest.mark.slurm
def test_finished_job_lands_in_jobcomp(slurm_cluster: SlurmCluster) -> None:
    name = f"jc-{uuid.uuid4().hex[:8]}"
    sub = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={name}", "-N1", "--output=/dev/null", "--wrap", "exit 3"],
        capture_output=True,
        text=True,
        timeout=30,
        env=slurm_cluster.client_env(),
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline and not line:
        if slurm_cluster.jobcomp_path.exists():
            line = next(
                (
                    ln
                    for ln in slurm_cluster.jobcomp_path.read_text().splitlines()
                    if f"JobId={job_id} " in ln
                ),
                "",
            )
        time.sleep(0.2)
    assert f"Name={name}" in line
    assert "JobState=FAILED" in line and "ExitCode=3:0" in line


@pytest.mark.slurm
def test_restart_slurmd(slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.kill_slurmd("n4")
    assert slurm_cluster.stack.slurm.live_record("slurmd-n4") is None
    slurm_cluster.restart_slurmd("n4")
    assert slurm_cluster.stack.slurm.live_record("slurmd-n4") is not None
    state = slurm_cluster.stack.slurm.node_states()["n4"]
    assert not state.endswith("*") and not state.startswith("down"), state


def _s3(env: dict[str, str], **override: str):  # noqa: ANN202 - a boto3 client
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=override.get("key", env["AWS_ACCESS_KEY_ID"]),
        aws_secret_access_key=override.get("secret", env["AWS_SECRET_ACCESS_KEY"]),
        region_name=env["AWS_DEFAULT_REGION"],
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.mark.s3
def test_s3_round_trip(s3_store_env: dict[str, str]) -> None:
    s3 = _s3(s3_store_env)
    key = f"stack-test/{uuid.uuid4().hex}"
    s3.put_object(Bucket=s3_store_env["LONGRUN_BUCKET"], Key=key, Body=b"hello")
    body = s3.get_object(Bucket=s3_store_env["LONGRUN_BUCKET"], Key=key)["Body"].read()
    assert body == b"hello"
    s3.delete_object(Bucket=s3_store_env["LONGRUN_BUCKET"], Key=key)


@pytest.mark.s3
@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"secret": "not-the-secret"}, "SignatureDoesNotMatch"),
        ({"key": "LRNOSUCHKEY0000000000"}, "InvalidAccessKeyId"),
    ],
)
def test_s3_refuses_wrong_credentials(
    s3_store_env: dict[str, str], override: dict[str, str], code: str
) -> None:
    with pytest.raises(ClientError) as err:
        _s3(s3_store_env, **override).list_objects_v2(Bucket=s3_store_env["LONGRUN_BUCKET"])
    assert err.value.response["Error"]["Code"] == code
