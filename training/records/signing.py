"""Alert signatures: HMAC-SHA256 over a record's canonical JSON, with a per-job key.

Shared by both sides: the job (`training.events`) signs every alert record it writes; the orchestrator
(`longrun.alert_auth`) verifies one before it drains, cancels or rolls back anything. Pure Python: no
torch, no Airflow, no boto3.

Canonical JSON: keys sorted, no whitespace, UTF-8, the signature field itself left out, floats as Python
writes them (`json.dumps` round-trips them exactly, so a record read back verifies). NaN and Infinity are
refused: they are not JSON and two writers may spell them differently.

The key reaches the job out of band: the submitting orchestrator puts it in the sbatch process's
environment (`LONGRUN_ALERT_KEY`, hex) and names it in `--export`, so it is in neither the batch script
nor any record; `key_from_env` reads it in the job.

`alert_not_mine` is the job's one rule for "did this job raise this alert": every reader in the job that
counts alerts (the launch wrapper's `launch-verdict`, the in-job restart check, the hot-spare supervisor's
alert watch) asks it, because anyone holding the job side's store credentials can write under a run's
`alerts/` and a forged alert counted there would turn a clean launch into an SDC verdict (exit 93).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("training.signing")

#: The environment variable that carries the job's key (hex) into the job.
KEY_ENV = "LONGRUN_ALERT_KEY"
#: The record field that holds the signature.
SIGNATURE_FIELD = "signature"
#: Signature text prefix: names the scheme, so another one can be added later without ambiguity.
SCHEME = "hmac-sha256:"
KEY_BYTES = 32


def new_key() -> bytes:
    """A fresh per-job key."""
    return secrets.token_bytes(KEY_BYTES)


def key_from_hex(text: str) -> bytes:
    """A key from its hex form; ValueError naming the problem (never the value) when it is not one."""
    try:
        key = bytes.fromhex(text)
    except (TypeError, ValueError):
        raise ValueError(f"{KEY_ENV}: not a hex string") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"{KEY_ENV}: expected {KEY_BYTES} bytes, got {len(key)}")
    return key


def key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's key, or None when the job was started without one (a local run, a test)."""
    text = (os.environ if env is None else env).get(KEY_ENV)
    return key_from_hex(text) if text else None


def canonical_json(record: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: `record` without its signature, keys sorted, no whitespace."""
    if not isinstance(record, Mapping):
        raise ValueError(f"record: expected a JSON object, got {type(record).__name__}")
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def signature(record: Mapping[str, Any], key: bytes) -> str:
    """The signature text of `record` under `key`."""
    return SCHEME + hmac.new(key, canonical_json(record), hashlib.sha256).hexdigest()


def sign(record: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """A copy of `record` with its signature field set."""
    return {**record, SIGNATURE_FIELD: signature(record, key)}


def verify(record: Mapping[str, Any], key: bytes) -> bool:
    """Does `record` carry a valid signature under `key`? (constant-time compare)."""
    sig = record.get(SIGNATURE_FIELD) if isinstance(record, Mapping) else None
    if not isinstance(sig, str) or not sig.startswith(SCHEME):
        return False
    try:
        expected = signature(record, key)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(sig.encode(), expected.encode())


@dataclass(frozen=True, slots=True)
class ThisJob:
    """What a reader in the job knows about its own job: the key its alerts are signed with (None: the
    job was started without one) and its Slurm job id (None: not in a Slurm job)."""

    key: bytes | None
    job_id: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, job_id: int | str | None = None) -> ThisJob:
        """From the job's environment (`LONGRUN_ALERT_KEY`, `SLURM_JOB_ID`, or `job_id` when given).
        Without a key it says so in one log line: every alert record then counts, as before alerts were
        signed (a local run, a test). A key that does not parse raises ValueError (never the value)."""
        env = os.environ if env is None else env
        key = key_from_env(env)
        raw = str(job_id if job_id is not None else env.get("SLURM_JOB_ID", ""))
        if key is None:
            log.info(
                "no %s in the environment: every alert record counts as this job's (none is checked)",
                KEY_ENV,
            )
        return cls(key=key, job_id=int(raw) if raw.isdigit() else None)


def alert_not_mine(record: Any, *, job: ThisJob, run: str | None) -> str | None:
    """Why `record` is not an alert this job raised, as a reason code, or None when it counts as one.

    With a key, an alert counts only when it carries a valid signature under the job's key (`unsigned`,
    `bad_signature`), names the run `run` (`other_run`; not checked when `run` is None) and names this
    job (`other_job`; where both the record and the reader know the job id: the trainer adds it whenever
    `SLURM_JOB_ID` is set). The same checks as the orchestrator's `alert_auth.verify_alert`, less the
    ones only the orchestrator can make (Slurm's record of the job, its allocation). Without a key every
    JSON object counts (today's behaviour where nothing is signed)."""
    if not isinstance(record, Mapping):
        return "not_an_object"
    if job.key is None:
        return None
    if not isinstance(record.get(SIGNATURE_FIELD), str):
        return "unsigned"
    if not verify(record, job.key):
        return "bad_signature"
    if run is not None and record.get("run") != run:
        return "other_run"
    named = record.get("job_id")
    if named is not None and job.job_id is not None and named != job.job_id:
        return "other_job"
    return None
