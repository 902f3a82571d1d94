"""One look at a running training job: what changed since the last look, as at most one event.

Pure of Airflow (the trigger runs it in a thread; tests and the bench call it directly). Order matters:
the job state is read FIRST, then the store. The trainer writes its alert (and its last checkpoint)
before it exits, so a job seen final here has already left everything it will leave in the store.

Events, most urgent first:
    alert       a new record under the run's alerts/ (the incident takes over)
    bad_alert   a new object under alerts/ that is not JSON or not an alert: the trigger records a
                security event and keeps watching (a job can write there; it must not end the watch)
    checkpoint  a new manifest under checkpoints/ (smallest step first; validate + promote it)
    job_done    the job is final and nothing new is in the store; or (label job_lost) the watched id now
                names another job, or none Slurm knows 30 s into the watch: Slurm lost the run's job (and
                may have given its id away), so it is never followed and never waited on forever
    launch_held Slurm holds the pending job after its launch failed (it never starts by itself)
    stale       the job runs but progress/latest.json has not moved for `stale_after_s`
    no_records  an entrypoint other than the reference trainer (`Seen.entrypoint`) left no longrun record
                at all (no progress, no segment of this job, no report): its job ended with exit 0, or has
                run `stale_after_s` without one. It does not use training.api (docs/adopting.md), so
                nothing it did was checked: a failure, never retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from longrun import alert_auth, security_events
from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobNotFoundError
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.outcomes import Kind, classify, held_after_failed_launch
from training.records import schema
from training.records.fields import opt_float, opt_str
from training.segment import SEGMENTS_DIR
from training.store.interface import NotFound, ObjectStore, StoreError, StoreTerminal, StoreUnavailable

ALERT, CHECKPOINT, JOB_DONE, STALE, ERROR = "alert", "checkpoint", "job_done", "stale", "error"
LAUNCH_HELD = "launch_held"
NO_RECORDS = "no_records"
#: A job_done's label when the watched id names another job now, or no job Slurm knows: the run's own
#: job was lost.
JOB_LOST = "job_lost"
#: How long the watched id may be unknown to Slurm, counted from the watch's start, before it is lost.
LOST_AFTER_S = ops.LOST_AFTER_S
#: An object under alerts/ that does not read as an alert: the trigger records a security event
#: (`record_bad_alert`) and goes on watching; never fired.
BAD_ALERT = "bad_alert"
UNREADABLE_ALERT, NOT_AN_ALERT = "unreadable_alert", "not_an_alert"
#: Where a run that writes no records is told what to do.
ADOPTING_DOC = "docs/adopting.md"


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """What the monitor has handled already (carried from one deferral to the next)."""

    run: str
    """Run name (the store prefix runs/<run>/)."""
    job_id: int
    """The Slurm job being watched."""
    steps: tuple[int, ...] = ()
    """Checkpoint steps already handled (validated, promoted or rejected)."""
    alerts: tuple[str, ...] = ()
    """Alert keys that existed before this job (an earlier attempt's) or were handed over already."""
    stale_after_s: float = 600.0
    """Progress older than this while the job runs is a stale heartbeat."""
    since: float = 0.0
    """Epoch seconds the watch began: the grace period before the first progress record."""
    entrypoint: str = ""
    """The run's entrypoint when it is not the reference trainer (`module:...`, `script:...`): a job of it
    that writes no longrun record at all is reported as such (`no_records`). Empty: the reference trainer,
    whose missing records take the stale and finish paths as they always have."""

    def __post_init__(self) -> None:
        schema.check_run_name(self.run)
        if isinstance(self.job_id, bool) or not isinstance(self.job_id, int) or self.job_id < 1:
            raise ValueError(f"job_id={self.job_id!r}: must be a Slurm job id (int >= 1)")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s={self.stale_after_s!r}: must be > 0")


def alert_keys(store: ObjectStore, run: str) -> list[str]:
    prefix = schema.store_key(run, "alerts/")
    return [o.key for o in store.list(prefix) if o.key.endswith(".json")]


def manifest_steps(store: ObjectStore, run: str) -> dict[int, str]:
    """step -> manifest key, for every checkpoint with a manifest (no manifest, no checkpoint)."""
    out: dict[int, str] = {}
    for o in store.list(schema.store_key(run, "checkpoints/")):
        step = schema.step_of_manifest_key(o.key)
        if step is not None:
            out[step] = o.key
    return out


def progress(store: ObjectStore, run: str) -> dict[str, Any] | None:
    try:
        rec = json.loads(store.get_bytes(schema.store_key(run, schema.PROGRESS_PATH)))
    except (NotFound, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def wrote_records(store: ObjectStore, seen: Seen) -> bool:
    """Whether the watched job left any longrun record: a segment of this job (training.segment names it
    by job id), a progress record written since the watch began, or the run report."""
    segments = schema.store_key(seen.run, f"{SEGMENTS_DIR}{seen.job_id}.")
    if next(iter(store.list(segments)), None) is not None:
        return True
    prog = progress(store, seen.run)
    if prog is not None and isinstance(prog.get("time"), int | float) and prog["time"] >= seen.since:
        return True
    return next(iter(store.list(schema.store_key(seen.run, schema.REPORT_PATH))), None) is not None


def no_records_message(seen: Seen, how: str) -> str:
    """Why a run whose entrypoint wrote no records fails (`how`: what the job did meanwhile)."""
    return (
        f"run {seen.run}: job {seen.job_id} {how} but its entrypoint {seen.entrypoint} wrote no longrun"
        " records (no progress, no segment of this job, no report): nothing it trained was checked. The"
        f" entrypoint must use training.api ({ADOPTING_DOC})"
    )


def _new_alert(store: ObjectStore, seen: Seen) -> tuple[dict[str, Any], str] | None:
    """(the event, its key) of the first alert under alerts/ not handled yet: an alert, or a bad_alert when
    the object does not read as one; None when there is none (or none readable at this look)."""
    for key in alert_keys(store, seen.run):
        if key not in seen.alerts:
            try:
                alert = json.loads(store.get_bytes(key))
            except NotFound:
                continue  # gone between the listing and the read: nothing to hand over
            except StoreUnavailable:
                raise  # the trigger watches through an outage
            except (StoreTerminal, ValueError) as e:  # refused for good; not JSON, not UTF-8
                return _bad_alert(key, UNREADABLE_ALERT, e), key
            except StoreError:
                continue  # a passing error: read again at the next look, never dropped
            try:
                schema.validate("alert", alert)
            except ValueError as e:  # a SchemaError, or not an object at all
                return _bad_alert(key, NOT_AN_ALERT, e), key
            return {"type": ALERT, "alert_key": key, "alert": alert}, key
    return None


def _lost(message: str, state: JobState | None) -> dict[str, Any]:
    return {
        "type": JOB_DONE,
        "outcome": Kind.TERMINAL.value,
        "label": JOB_LOST,
        "message": f"{message} The run's promoted checkpoints stand: trigger training_run again to resume"
        " from the newest",
        "state": None if state is None else state.to_dict(),
    }


def _unknown_job(seen: Seen, now: float) -> dict[str, Any] | None:
    """Nothing while the watched id may be unknown for a passing reason (a slurmctld restarting under the
    look: the grace of ops.wait_for_own); after it, job_lost. sbatch answered only once the controller
    held the job, and a job that ended stays known (the controller, then the job completion record): an
    id Slurm does not know is a job it lost, or one purged without a completion record. Either way the
    watch would otherwise wait forever."""
    if now - seen.since <= LOST_AFTER_S:
        return None
    return _lost(
        f"lost: Slurm does not know job {seen.job_id} (neither the controller nor the job completion record),"
        f" this watch began {now - seen.since:.0f} s ago: a slurmctld restarted without its state, or the job"
        " ended and was purged with no completion record; the run's report says whether it finished.",
        None,
    )


def _job_event(
    store: ObjectStore, seen: Seen, state: JobState | None, prog: dict[str, Any] | None, now: float
) -> dict[str, Any] | None:
    """The event the job's state calls for (no_records, job_done, launch_held, stale), or None."""
    if state is None:
        return _unknown_job(seen, now)
    if why := alert_auth.job_is_ours(state, seen.run):
        # Slurm reuses job ids (a slurmctld that died before saving a job it had accepted gives the id to a
        # later submission): the run's job is gone, and the job now holding the id is never followed.
        return _lost(
            f"lost: {why}; the run's own job is gone (a slurmctld restarted without its state?).", state
        )
    outcome = classify(state)
    if outcome.kind is Kind.SUCCESS and seen.entrypoint and not wrote_records(store, seen):
        return {
            "type": NO_RECORDS,
            "outcome": outcome.kind.value,
            "label": NO_RECORDS,
            "message": no_records_message(seen, f"ended ({state.describe()})"),
            "state": state.to_dict(),
        }
    if outcome.kind is not Kind.RUNNING:
        return {
            "type": JOB_DONE,
            "outcome": outcome.kind.value,
            "label": outcome.label,
            "message": outcome.message,
            "state": state.to_dict(),
        }
    if held_after_failed_launch(state):
        # Pending "by the table", but nothing will start it: without this the monitor waits forever.
        return {
            "type": LAUNCH_HELD,
            "message": f"run {seen.run}: Slurm holds job {seen.job_id} after a failed launch"
            f" ({state.describe()}); it will not start until it is released",
            "state": state.to_dict(),
        }
    if state.status is JobStatus.RUNNING:
        last = float(prog["time"]) if prog and isinstance(prog.get("time"), int | float) else seen.since
        age = now - max(last, seen.since)
        if age > seen.stale_after_s and seen.entrypoint and not wrote_records(store, seen):
            return {
                "type": NO_RECORDS,
                "age_s": round(age, 1),
                "progress": prog,
                "message": no_records_message(seen, f"has run {age:.0f} s"),
            }
        if age > seen.stale_after_s:
            return {
                "type": STALE,
                "age_s": round(age, 1),
                "progress": prog,
                "message": f"run {seen.run}: no progress for {age:.0f} s (job {seen.job_id} still running)",
            }
    return None


def look(
    store: ObjectStore, client: SlurmClient, seen: Seen, *, now: float | None = None
) -> tuple[dict[str, Any] | None, Any]:
    """(event or None, an activity key that changes while the run makes progress: for back-off)."""
    now = time.time() if now is None else now
    try:
        state: JobState | None = client.job(seen.job_id)
    except JobNotFoundError:
        state = None  # just submitted and not visible yet
    if (found := _new_alert(store, seen)) is not None:
        return found
    manifests = manifest_steps(store, seen.run)
    new = sorted(set(manifests) - set(seen.steps))
    if new:
        return {"type": CHECKPOINT, "step": new[0], "manifest_key": manifests[new[0]]}, new[0]
    prog = progress(store, seen.run)
    activity = (state.status.value if state else None, prog.get("step") if prog else None)
    return _job_event(store, seen, state, prog, now), activity


def _bad_alert(key: str, reason: str, err: Exception) -> dict[str, Any]:
    return {
        "type": BAD_ALERT,
        "alert_key": key,
        "reason": reason,
        "message": f"{type(err).__name__}: {str(err)[:300]}",
    }


def record_bad_alert(store: ObjectStore, seen: Seen, event: dict[str, Any]) -> None:
    """A `bad_alert` event as a security event (orchestrator side, with the runbook), never an end of the
    watch: anyone holding the job side's credentials can write under `alerts/`."""
    security_events.raise_event(
        store,
        run=seen.run,
        reason=str(event["reason"]),
        details={
            "alert_key": event["alert_key"],
            "job_id": seen.job_id,
            "why": event.get("message"),
            "by": "training_run.monitor",
        },
    )


def job_running(activity: Any) -> bool:
    """Whether `look`'s activity key says the job is RUNNING."""
    return isinstance(activity, tuple) and activity[:1] == (JobStatus.RUNNING.value,)


def handled(seen: Seen, event: dict[str, Any]) -> Seen:
    """The Seen after `event` was dealt with."""
    if event.get("type") == CHECKPOINT:
        return replace(seen, steps=tuple(sorted({*seen.steps, int(event["step"])})))
    if event.get("type") in (ALERT, BAD_ALERT):
        return replace(seen, alerts=tuple(sorted({*seen.alerts, str(event["alert_key"])})))
    return seen


def seen_to_dict(seen: Seen) -> dict[str, Any]:
    return {
        "run": seen.run,
        "job_id": seen.job_id,
        "steps": list(seen.steps),
        "alerts": list(seen.alerts),
        "stale_after_s": seen.stale_after_s,
        "since": seen.since,
        # only when set: a watch of the reference trainer serializes as it always has
        **({"entrypoint": seen.entrypoint} if seen.entrypoint else {}),
    }


def seen_from_dict(d: dict[str, Any]) -> Seen:
    """The Seen that `seen_to_dict` wrote. A field it lacks (a number also when null) takes Seen's default:
    the defaults live in Seen alone."""
    given: dict[str, Any] = {"run": str(d["run"]), "job_id": int(d["job_id"])}
    if "steps" in d:
        given["steps"] = tuple(int(s) for s in d["steps"])
    if "alerts" in d:
        given["alerts"] = tuple(str(a) for a in d["alerts"])
    for name in ("stale_after_s", "since"):
        if (value := opt_float("seen", d, name)) is not None:  # numbers as written: 600 stays 600
            given[name] = value
    if entrypoint := opt_str("seen", d, "entrypoint"):
        given["entrypoint"] = entrypoint
    return Seen(**given)


def ignore_existing(
    store: ObjectStore,
    run: str,
    steps_done: Sequence[int],
    *,
    job_id: int | None = None,
    continuation: bool = False,
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """At the start of a watch (a first try or a retry): the alerts this watch must not act on again,
    and the checkpoint steps already promoted.

    An alert is passed over only when it is provably handled or not this job's: an incident exists for it
    (handed over), it names another Slurm job (an earlier attempt's), or it names no job and this watch
    continues a run (an attempt before alerts carried job ids). An alert of the watched job that no
    incident took is NOT passed over: a retried monitor must hand it over, not drop it. Without
    `job_id` (old callers): every alert in the store, as before."""
    keys = alert_keys(store, run)
    if job_id is None:
        return tuple(keys), tuple(sorted(set(steps_done)))
    handled_ids = {
        o.key.rsplit("/", 1)[-1].removesuffix(".json")
        for o in store.list(schema.store_key(run, "incidents/"))
        if o.key.endswith(".json")
    }
    ignored = []
    for key in keys:
        if schema.incident_id_for(key) in handled_ids:
            ignored.append(key)
            continue
        try:
            alert = json.loads(store.get_bytes(key))
        except (NotFound, ValueError):
            continue  # unreadable now: look() reads it again and decides
        named = alert.get("job_id") if isinstance(alert, dict) else None
        if (named is not None and named != job_id) or (named is None and continuation):
            ignored.append(key)
    return tuple(ignored), tuple(sorted(set(steps_done)))
