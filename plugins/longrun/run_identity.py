"""Per-run store identities: a job's credentials reach only its own run's keys.

At submit the orchestrator asks for the run's credentials (`RunIdentities.issue`) and hands them to the
job in sbatch's environment (`longrun.alert_auth.submit_env`); when the run's last job has ended it
removes them (`RunIdentities.revoke`: the monitor at the job's end, the incident's summary when it did
not relaunch). Which implementation serves is the orchestrator's setting `LONGRUN_RUN_IDENTITIES`:

    seaweedfs   one SeaweedFS identity per run (`SeaweedRunIdentities`), created and removed through the
                IAM API SeaweedFS embeds on its S3 port, with the orchestrator's (Admin) keys. Its policy
                (`run_policy`) allows read, write and list of `<job bucket>/runs/<run>/*` and read and
                list of `<orchestrator bucket>/runs/<run>/directives/*`, nothing else. The local stack
                sets it (`longrun stack env`).
    shared      the shared job identity (`SharedJobIdentity`; also when unset): the keys in LONGRUN_JOB_ACCESS_KEY_ID /
                LONGRUN_JOB_SECRET_ACCESS_KEY, else the node's own credentials
                (`longrun.store_access.job_store_env`); every run's job holds the same rights.

On AWS the same policy is the session policy of an STS AssumeRole (docs/security.md); longrun does not
call STS itself.

Why rotate at each issue instead of keeping one key per run: a retried submit, or a relaunch of the run,
calls `issue` again. Deleting the identity's keys and creating one fresh key leaves exactly one identity
and one key per run whatever the number of tries, and no secret has to be kept in the store. An earlier
job of the run (ended: the submit reattaches to a live one instead of submitting, a relaunch ends the old
job first) loses its keys then.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from longrun.store_access import job_store_env
from training.records import schema

__all__ = [
    "IDENTITY_PREFIX",
    "KINDS",
    "RUN_IDENTITIES_ENV",
    "RunIdentities",
    "RunIdentityError",
    "SeaweedRunIdentities",
    "SharedJobIdentity",
    "identities_from_env",
    "identity_name",
    "run_policy",
]

#: The orchestrator's setting that picks the implementation (module docstring).
RUN_IDENTITIES_ENV = "LONGRUN_RUN_IDENTITIES"
#: Its values: per-run SeaweedFS identities, or the shared job identity (also when unset).
KINDS = ("seaweedfs", "shared")
#: Every per-run identity's name starts with this; the run name follows.
IDENTITY_PREFIX = "longrun-run-"
#: The name of the inline policy each per-run identity carries.
POLICY_NAME = "longrun-run"
#: Store-credential names in what `issue` returns (the rest are plain store settings).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: How long `issue` waits for the S3 gateway to accept a fresh key (a gateway that reads identities
#: from the filer sees a change after its next sync; `weed mini`'s own gateway at once).
HONOURED_TIMEOUT_S = 30.0


class RunIdentityError(RuntimeError):
    """The store refused to create or remove a run's identity; the message says what to fix."""


class RunIdentities(Protocol):
    """Who gives a run's job its store credentials, and takes them back."""

    def issue(self, run: str) -> dict[str, str]:
        """The store entries of `run`'s job environment, its credentials among them (`CREDENTIAL_ENV`)."""
        ...

    def revoke(self, run: str) -> bool:
        """Remove `run`'s credentials; True when there were some to remove (safe when already gone)."""
        ...


def identity_name(run: str) -> str:
    """The SeaweedFS identity of `run` (a checked run name: no wildcard or path character reaches it)."""
    return IDENTITY_PREFIX + schema.check_run_name(run)


def run_policy(run: str, *, job_bucket: str, orch_bucket: str) -> dict[str, Any]:
    """The policy of `run`'s job, in AWS IAM's grammar: objects under `<job bucket>/runs/<run>/` (read,
    write, delete, multipart), listing only under that prefix, and read and list of its own directives
    in the orchestrator bucket. SeaweedFS enforces it as written (listing by the `s3:prefix` condition);
    on AWS it is the session policy (docs/security.md prints it)."""
    run = schema.check_run_name(run)
    own = f"runs/{run}/"
    directives = f"runs/{run}/directives/"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OwnRunObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": f"arn:aws:s3:::{job_bucket}/{own}*",
            },
            {
                "Sid": "OwnRunList",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{job_bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{own}*"}},
            },
            {
                "Sid": "OwnDirectives",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{orch_bucket}/{directives}*",
            },
            {
                "Sid": "OwnDirectivesList",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{orch_bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{directives}*"}},
            },
        ],
    }


class SharedJobIdentity:
    """One identity for every run (the keys `job_store_env` hands out): nothing to create or remove."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def issue(self, run: str) -> dict[str, str]:
        schema.check_run_name(run)
        return job_store_env(self.env)

    def revoke(self, run: str) -> bool:
        schema.check_run_name(run)
        return False


def _code(e: Exception) -> str:
    response = getattr(e, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class SeaweedRunIdentities:
    """Per-run identities on SeaweedFS, through the IAM API on its S3 port (`-s3.iam`, with
    `-s3.iam.readOnly=false`), called with the orchestrator's keys from `env` (an Admin identity: only
    Admin may create users or set policies; an identity may only list, create and delete its own keys)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        missing = [k for k in ("AWS_ENDPOINT_URL", "LONGRUN_BUCKET", "LONGRUN_ORCH_BUCKET") if not env.get(k)]
        if missing:
            raise RunIdentityError(
                f"{RUN_IDENTITIES_ENV}=seaweedfs needs {', '.join(missing)}: per-run identities scope a job to"
                " its run inside a store with two sides"
            )
        self.env = env
        self.endpoint = env["AWS_ENDPOINT_URL"]
        self.job_bucket = env["LONGRUN_BUCKET"]
        self.orch_bucket = env["LONGRUN_ORCH_BUCKET"]

    def _client_args(self, key_id: str | None, secret: str | None) -> dict[str, Any]:
        from botocore.config import Config

        return {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": key_id or self.env.get("AWS_ACCESS_KEY_ID"),
            "aws_secret_access_key": secret or self.env.get("AWS_SECRET_ACCESS_KEY"),
            "region_name": self.env.get("AWS_DEFAULT_REGION") or self.env.get("AWS_REGION") or "us-east-1",
            "config": Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=30),
        }

    def _iam(self) -> Any:
        """The IAM API, as the orchestrator."""
        import boto3

        return boto3.client("iam", **self._client_args(None, None))

    def _s3(self, key_id: str, secret: str) -> Any:
        """The S3 API, as the holder of `key_id`."""
        import boto3

        return boto3.client("s3", **self._client_args(key_id, secret))

    def _refused(self, what: str, e: Exception) -> RunIdentityError:
        msg = str(e)
        hint = ""
        if "IAM write operations are disabled" in msg:
            hint = (
                ": this SeaweedFS answers IAM reads only; start it with -s3.iam.readOnly=false (the local"
                " stack does since per-run identities: `longrun stack down --only s3` then `up --only s3`)"
            )
        elif _code(e) in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            hint = ": only an Admin identity may manage identities; the orchestrator's keys are not one"
        return RunIdentityError(f"SeaweedFS at {self.endpoint} refused to {what}: {msg}{hint}")

    def issue(self, run: str) -> dict[str, str]:
        """Create `run`'s identity (or keep it), set its policy, replace its keys by one fresh key, and
        wait until the S3 gateway accepts that key."""
        name = identity_name(run)
        policy = json.dumps(run_policy(run, job_bucket=self.job_bucket, orch_bucket=self.orch_bucket))
        iam = self._iam()
        try:
            try:
                iam.create_user(UserName=name)
            except Exception as e:
                if _code(e) != "EntityAlreadyExists":
                    raise
            iam.put_user_policy(UserName=name, PolicyName=POLICY_NAME, PolicyDocument=policy)
            for old in iam.list_access_keys(UserName=name).get("AccessKeyMetadata", []):
                iam.delete_access_key(UserName=name, AccessKeyId=old["AccessKeyId"])
            fresh = iam.create_access_key(UserName=name)["AccessKey"]
        except Exception as e:
            raise self._refused(f"issue the store identity {name} of run {run}", e) from e
        key_id, secret = str(fresh["AccessKeyId"]), str(fresh["SecretAccessKey"])
        self._wait_until_honoured(run, key_id, secret)
        plain = {k: v for k, v in job_store_env(self.env).items() if k not in CREDENTIAL_ENV}
        return {**plain, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}

    def _wait_until_honoured(self, run: str, key_id: str, secret: str) -> None:
        """Bounded: list the run's own prefix with the fresh key until the gateway knows it."""
        s3 = self._s3(key_id, secret)
        deadline = time.monotonic() + HONOURED_TIMEOUT_S
        while True:
            try:
                s3.list_objects_v2(Bucket=self.job_bucket, Prefix=f"runs/{run}/", MaxKeys=1)
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise RunIdentityError(
                        f"SeaweedFS at {self.endpoint} did not accept the fresh key of {identity_name(run)}"
                        f" within {HONOURED_TIMEOUT_S:.0f} s: {e}"
                    ) from e
                time.sleep(0.2)

    def key_ids(self, run: str) -> list[str]:
        """The access key ids `run`'s identity holds now (none when it has no identity)."""
        name = identity_name(run)
        try:
            keys = self._iam().list_access_keys(UserName=name).get("AccessKeyMetadata", [])
        except Exception as e:
            if _code(e) == "NoSuchEntity":
                return []
            raise self._refused(f"list the keys of {name}", e) from e
        return sorted(str(k["AccessKeyId"]) for k in keys)

    def revoke(self, run: str) -> bool:
        """Delete `run`'s keys (its own and any it made itself), its policy and the identity."""
        name = identity_name(run)
        iam = self._iam()
        try:
            try:
                keys = iam.list_access_keys(UserName=name).get("AccessKeyMetadata", [])
            except Exception as e:
                if _code(e) == "NoSuchEntity":
                    return False
                raise
            for key in keys:
                iam.delete_access_key(UserName=name, AccessKeyId=key["AccessKeyId"])
            try:
                iam.delete_user_policy(UserName=name, PolicyName=POLICY_NAME)
            except Exception as e:
                if _code(e) != "NoSuchEntity":
                    raise
            try:
                iam.delete_user(UserName=name)
            except Exception as e:
                if _code(e) != "NoSuchEntity":
                    raise
                return False
        except Exception as e:
            raise self._refused(f"remove the store identity {name} of run {run}", e) from e
        return True


def identities_from_env(env: Mapping[str, str] | None = None) -> RunIdentities:
    """The implementation `LONGRUN_RUN_IDENTITIES` in `env` (default: this process's) names."""
    env = os.environ if env is None else env
    kind = env.get(RUN_IDENTITIES_ENV) or "shared"
    if kind == "seaweedfs":
        return SeaweedRunIdentities(env)
    if kind == "shared":
        return SharedJobIdentity(env)
    raise RunIdentityError(f"{RUN_IDENTITIES_ENV}={kind!r} is not one of {', '.join(KINDS)}")
