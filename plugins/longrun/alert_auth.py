"""Per-job alert keys, and the check an alert must pass before longrun acts on it.

At submit the orchestrator creates a key for the job (`issue`), keeps it on the orchestrator side of the
store (`ops/alert-keys/`, which a job's identity can neither read nor write) and hands it to the job out
of band: in the sbatch process's environment, named in `--export` (`submit_env`), never in the batch
script, a log line or a record. The job signs every alert with it (`training.records.signing`).

`verify_alert` is the gate in front of every destructive step (freeze = cancel, drain, relaunch = roll
back) and of the monitor's hand-over. An alert is acted on only when all of these hold:
    the job is longrun's job for this run   Slurm's job name is the run and its comment is longrun's
                                            tag (or, once Slurm has forgotten the comment, the key
                                            record bound to the job id names the run)
    there is a key for the job              issued by this orchestrator at submit and bound to the
                                            job id (the public tag alone finds none)
    the signature is valid                  HMAC-SHA256 over the canonical JSON
    it is about this run and this job       `run` and `job_id` inside the signed record
    its suspect nodes are the job's         every one is in Slurm's NodeList of the job
Anything else is a refusal with a reason code; the caller raises a security event and acts on nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobNotFoundError
from longrun.slurm.models import JobState
from longrun.slurm.spec import JobTag
from training.records import schema, signing
from training.records.base import EXTRA_HERE, FIELDS_HERE, Declared
from training.records.fields import SET, Field, opt_float, opt_int, opt_str
from training.store.interface import NotFound, ObjectStore, StoreError, dump_json
from training.store.update import create_or_read, update_json

KEY_FOLDER = "ops/alert-keys/"
#: DAGs whose jobs carry longrun's tag for a run (the first launch and every relaunch).
RUN_DAGS = ("training_run", "sdc_incident")
#: Store-credential names a job gets by export from the sbatch process (values never in the script).
SECRET_STORE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


log = logging.getLogger("longrun.alert_auth")


def _tag_key(tag: str) -> str:
    return f"{KEY_FOLDER}tag-{hashlib.sha256(tag.encode()).hexdigest()[:40]}.json"


def _job_key(job_id: int) -> str:
    return f"{KEY_FOLDER}job-{int(job_id)}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertKey(Declared):
    """The `alert_key` record (`ops/alert-keys/`): a job's signing key, issued for its tag at submit
    and, once the job has an id, bound to it (the same record with `job_id`, written last)."""

    KIND = "alert_key"
    FIELDS = {
        "run": Field(opt_str),
        "tag": Field(opt_str, need=False, when=SET),
        "key": Field(opt_str, when=SET),
        "time": Field(opt_float, need=False, when=SET),
        "job_id": Field(opt_int, need=False, when=SET),
    }
    ORDER = ("schema_version", "kind", FIELDS_HERE, EXTRA_HERE, "job_id")

    run: str
    tag: str | None = None
    key: str
    """The key, hex."""
    time: float | None = None
    job_id: int | None = None
    """Set in the record bound to the job (`bind`)."""
    schema_version: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields this reader does not know, kept as written."""


def _load(store: ObjectStore, key: str) -> AlertKey | None:
    """The key record at `key`; None when there is none or it is not a well-formed one."""
    try:
        return _parse(store.get_bytes(key))
    except NotFound:
        return None


def _parse(data: bytes) -> AlertKey | None:
    """A key record's bytes as one; None when they are not a well-formed one."""
    try:
        return AlertKey.from_json(data)
    except ValueError:  # bad JSON or a SchemaError naming the field
        return None


def issue(store: ObjectStore, *, run: str, tag: str) -> bytes:
    """The key of the job submitted with `tag` (created now, or the one an earlier try created)."""
    schema.check_run_name(run)
    key = _tag_key(tag)
    if (rec := _load(store, key)) is not None and rec.run == run:
        return signing.key_from_hex(rec.key)
    fresh = signing.new_key()
    body = AlertKey(run=run, tag=tag, key=fresh.hex(), time=time.time())
    first = create_or_read(store, key, dump_json(body.to_json()))  # of two racing tries, one key
    if first.created:
        return fresh
    rec = _parse(first.data)
    if rec is None or rec.run != run:
        raise RuntimeError(f"alert key for tag {tag!r} exists but belongs to another run")
    return signing.key_from_hex(rec.key)


def bind(store: ObjectStore, *, run: str, tag: str, job_id: int) -> None:
    """Remember which job got the key of `tag` (Slurm forgets a job's comment when it forgets the job).

    Bound before for the same tag (a retry): that stands. Bound before for another tag: Slurm gave the id
    to a new job, which it does only once the earlier one is gone (a slurmctld that died before saving a
    job it had accepted forgets it and hands its id to the next submission; or the id counter wrapped).
    The caller just learned from Slurm that `job_id` is the job of `tag`, so the binding follows it; kept,
    the stale one would have refused every alert of the new job as `no_key`."""
    rec = _load(store, _tag_key(tag))
    if rec is None:
        return
    bound = dataclasses.replace(rec, job_id=int(job_id)).to_json()

    def change(raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return bound
        earlier = _parse(raw)
        if earlier is not None and (earlier.run, earlier.tag) == (rec.run, rec.tag):
            return None
        log.warning(
            "Slurm job %s was bound to %s; Slurm gave the id to a new job (tag %s of run %s): binding that",
            job_id,
            f"tag {earlier.tag} of run {earlier.run}" if earlier else "a record that does not read",
            rec.tag,
            rec.run,
        )
        return bound

    update_json(
        store, _job_key(job_id), change, dump=dump_json, load=bytes, create=True, what="alert key binding"
    )


def bound_tag(store: ObjectStore, *, run: str, job_id: int) -> str | None:
    """The tag the orchestrator submitted Slurm job `job_id` of `run` with, from the record `bind` wrote
    (orchestrator side); None when it bound none. Unlike the job's `--comment`, no job can write it."""
    rec = _load(store, _job_key(job_id))
    if rec is None or rec.run != run or rec.job_id != int(job_id):
        return None
    return rec.tag


def submit_env(store: ObjectStore, *, run: str, tag: str, env: Mapping[str, str]) -> dict[str, str]:
    """The secret part of a job's environment, for the sbatch process only: the job's alert key and the
    store credentials of its run (`longrun.run_identity`: the run's own identity, created now, where the
    orchestrator's `env` sets per-run identities; else the shared job identity)."""
    from longrun.run_identity import identities_from_env

    store_env = identities_from_env(env).issue(run)
    out = {k: store_env[k] for k in SECRET_STORE_ENV if store_env.get(k)}
    out[signing.KEY_ENV] = issue(store, run=run, tag=tag).hex()
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking an alert (never holds the key)."""

    ok: bool
    reason: str
    """`ok`, or the refusal's code (a security event's reason)."""
    details: dict[str, Any] = field(default_factory=dict)
    allocation: tuple[str, ...] = ()
    """Slurm's NodeList of the job (when it was read)."""


def job_is_ours(state: JobState, run: str) -> str | None:
    """None when `state` is longrun's job for `run` by Slurm's own record, else why not."""
    if state.name and state.name != run:
        return f"Slurm job {state.job_id} is named {state.name!r}, not the run {run!r}"
    if state.comment:
        tag = JobTag.parse(state.comment)
        if tag is None or tag.dag_id not in RUN_DAGS:
            return f"Slurm job {state.job_id} does not carry longrun's tag (comment {state.comment[:80]!r})"
    return None


def job_key(store: ObjectStore, state: JobState, run: str) -> bytes | None:
    """The key this orchestrator issued for the job, found only through the record that binds it to the
    job id (`bind`, right after sbatch answered). Never through the job's tag alone: the tag is Slurm's
    public `--comment`, which any job can copy, so a job the orchestrator never bound gets no key."""
    rec = _load(store, _job_key(state.job_id))
    if rec is None or rec.run != run:
        return None
    if rec.job_id != state.job_id:
        return None
    if state.comment and rec.tag != state.comment:
        return None
    return signing.key_from_hex(rec.key)


def verify_alert(
    store: ObjectStore,
    client: SlurmClient,
    *,
    run: str,
    job_id: int | None,
    alert: Mapping[str, Any],
    known_allocation: tuple[str, ...] = (),
) -> Verdict:
    """Check `alert` against the job `job_id` of `run` (see the module docstring).

    `known_allocation`: nodes Slurm gave this same job when an earlier check of this alert passed (the
    incident record, which only the orchestrator writes). Slurm's view of a job's nodes can be lost later:
    a slurmctld killed before it saved the job's end recovers it as running, then requeues it for node
    failure (no nodes since). The nodes the job had then still count; the signature is checked each time."""
    details: dict[str, Any] = {
        "job_id": job_id,
        "alert_run": alert.get("run"),
        "alert_job_id": alert.get("job_id"),
        "suspect_nodes": list(alert.get("suspect_nodes") or []),
        "step": alert.get("step"),
        "check": alert.get("check"),
    }
    if not isinstance(alert.get(signing.SIGNATURE_FIELD), str):
        return Verdict(False, "unsigned", details)
    if job_id is None:
        return Verdict(False, "no_job", details)
    try:
        state = client.job(int(job_id))
    except JobNotFoundError:
        return Verdict(False, "no_job", details)
    details["job_name"], details["job_comment"] = state.name, state.comment
    if why := job_is_ours(state, run):
        return Verdict(False, "not_our_job", {**details, "why": why})
    try:
        key = job_key(store, state, run)
    except (StoreError, ValueError) as e:
        return Verdict(False, "no_key", {**details, "why": str(e)})
    if key is None:
        why = (
            f"no alert key bound to Slurm job {int(job_id)} for run {run!r}; a job's public tag alone is"
            " never trusted to find one"
        )
        return Verdict(False, "no_key", {**details, "why": why})
    if not signing.verify(alert, key):
        return Verdict(False, "bad_signature", details)
    if alert.get("run") != run:
        return Verdict(False, "other_run", details)
    if alert.get("job_id") != int(job_id):
        return Verdict(False, "other_job", details)
    allocation = tuple(dict.fromkeys((*state.nodes, *known_allocation)))
    details["allocation"] = list(allocation)
    if known_allocation:
        details["known_allocation"] = list(known_allocation)
    suspects = details["suspect_nodes"]
    outside = [n for n in suspects if n not in allocation]
    if outside or not allocation:
        return Verdict(False, "node_outside_allocation", {**details, "outside": outside}, allocation)
    return Verdict(True, "ok", details, allocation)
