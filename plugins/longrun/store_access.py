"""What a job gets to reach the store: the job identity, never the orchestrator's.

Which side a key lives on is decided in `training.store.sides` (both packages import it). This module is
the orchestrator's half: the store entries of a job's environment. The launcher exports these and nothing
else of the worker's store configuration, so a rank holds only the job identity's keys.

Where per-run identities are on (`LONGRUN_RUN_IDENTITIES`), `longrun.run_identity` replaces these keys by
the run's own. Otherwise, where the job's keys come from, in order:
    LONGRUN_JOB_ACCESS_KEY_ID / LONGRUN_JOB_SECRET_ACCESS_KEY   (`longrun stack env` prints them)
    nothing, when the store has two sides but no job keys are set: the job then uses the credentials the
        node itself provides (an instance profile or a role the job assumes; see docs/security.md)
    the orchestrator's own keys, only in the one-sided layout (no LONGRUN_ORCH_BUCKET), which has no
        trust boundary at all
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["JOB_KEY_ENV", "job_store_env", "two_sided"]

#: Where the orchestrator finds the job identity's keys (never exported to a job under these names).
JOB_KEY_ENV = ("LONGRUN_JOB_ACCESS_KEY_ID", "LONGRUN_JOB_SECRET_ACCESS_KEY")
#: Store settings a job needs as they are (no secret among them).
_PLAIN = (
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "LONGRUN_S3",
    "LONGRUN_BUCKET",
    "LONGRUN_ORCH_BUCKET",
    "LONGRUN_STORE_DIR",
    "LONGRUN_ORCH_STORE_DIR",
)


def two_sided(env: Mapping[str, str] | None = None) -> bool:
    """Does the environment name an orchestrator side apart from the job side?"""
    env = os.environ if env is None else env
    return bool(env.get("LONGRUN_ORCH_BUCKET") or env.get("LONGRUN_ORCH_STORE_DIR"))


def job_store_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The store entries of a job's environment, built from the orchestrator's `env` (default: this
    process's): endpoint, bucket names, and the job identity's keys as AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY."""
    env = os.environ if env is None else env
    out = {k: env[k] for k in _PLAIN if env.get(k)}
    key_id, secret = (env.get(k, "") for k in JOB_KEY_ENV)
    if bool(key_id) != bool(secret):
        raise ValueError(f"set both {JOB_KEY_ENV[0]} and {JOB_KEY_ENV[1]}, or neither")
    if key_id:
        out["AWS_ACCESS_KEY_ID"], out["AWS_SECRET_ACCESS_KEY"] = key_id, secret
    elif not two_sided(env):
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            if env.get(k):
                out[k] = env[k]
    return out
