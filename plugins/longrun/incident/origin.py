"""Who an incident is about and how it acts, read from the store; the DAG run's conf is only a claim.

Anyone allowed to trigger `sdc_incident` writes its conf, and the monitor's hand-over writes the same
keys. So no task believes it (`incident_of`):

    alert      the incident record's copy once the incident opened (orchestrator side, written from an
               alert whose signature checked out), before that the record at `alert_key`
    run        the run of `alert_key` (`runs/<run>/alerts/...`)
    job        the job the signed alert names (`job_id`)
    mode, spec the params of the launch that ran that job, as the orchestrator recorded it
               (longrun.monitor.launches; the launches recorded before the incident opened)

Each of `run_name`, `alert`, `job_id` and `run_params` in the conf, where given, must agree with what is
read (a `run_params` claims only the keys it sets); otherwise the incident is refused before anything is
acted on, with a security event naming the field. `alert_seen_at` (when the monitor saw the alert) only
times the hand-over and is taken as given. Whether the alert itself checks out (signature, job,
allocation) is `runner.authenticate`'s business, in front of every action.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from longrun import security_events
from longrun.incident import record
from longrun.incident.events import Event
from longrun.incident.runner import Incident
from longrun.monitor.launches import differences, launch_of_job
from training.records import schema, signing
from training.records.alert import Alert
from training.records.schema import SchemaError
from training.store.interface import NotFound, ObjectStore

#: Security event reasons of a refusal here.
CONF_DISAGREES = "conf_disagrees"
ALERT_NOT_FOUND = "alert_not_found"
NOT_AN_ALERT = "not_an_alert"
NO_LAUNCH_RECORD = "no_launch_record"


class ConfRefused(Exception):
    """The conf disagrees with the store, or the store lacks what the incident needs: nothing is acted on.
    The message says what and names the runbook."""


def run_of_alert_key(alert_key: str) -> str:
    """The run of `runs/<run>/alerts/<name>.json`; SchemaError for anything else."""
    parts = alert_key.split("/")
    if len(parts) != 4 or parts[0] != "runs" or parts[2] != "alerts" or not parts[3].endswith(".json"):
        raise SchemaError(f"alert_key={alert_key!r} is not runs/<run>/alerts/<name>.json")
    schema.incident_id_for(alert_key)  # a name the incident id can be made of
    return schema.check_run_name(parts[1])


def _refuse(store: ObjectStore, run: str, reason: str, why: str, details: Mapping[str, Any]) -> ConfRefused:
    security_events.raise_event(store, run=run, reason=reason, details=dict(details))
    return ConfRefused(f"{why}. Runbook: {security_events.RUNBOOK}")


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _opened(store: ObjectStore, run: str, incident_id: str) -> tuple[Mapping[str, Any], float | None] | None:
    """(the alert copy, when the incident opened) from its record, or None when it has not opened."""
    try:
        rec = record.load_typed(store, run=run, incident_id=incident_id)
    except NotFound:
        return None
    opened = rec.event(Event.OPENED)
    return rec.alert, (opened.time if opened is not None else None)


def _stored_alert(store: ObjectStore, run: str, key: str, seen: dict[str, Any]) -> Mapping[str, Any]:
    try:
        alert = json.loads(store.get_bytes(key))
    except NotFound:
        raise _refuse(
            store,
            run,
            ALERT_NOT_FOUND,
            f"no alert at {key} in the store: an incident starts only from a stored alert",
            seen,
        ) from None
    except ValueError as e:
        raise _refuse(store, run, NOT_AN_ALERT, f"{key} is not JSON ({e})", seen) from None
    try:
        Alert.from_json(alert)
    except (SchemaError, TypeError) as e:
        raise _refuse(store, run, NOT_AN_ALERT, f"{key} is not an alert record ({e})", seen) from None
    return dict(alert)


def incident_of(store: ObjectStore, params: Mapping[str, Any], dag_run_id: str) -> Incident:
    """The Incident of the `sdc_incident` DAG run `dag_run_id` with conf `params`, from the store.

    Why one function: it is one ordered list of reads, each naming what the next one looks up (the key
    gives the run and the record, the record or the key the alert, the alert the job, the job its launch),
    and each comparison with the conf refuses at the first disagreement."""
    key = str(params["alert_key"])
    try:
        run = run_of_alert_key(key)
    except (SchemaError, ValueError) as e:
        raise ConfRefused(str(e)) from None
    seen: dict[str, Any] = {"alert_key": key, "dag_run_id": dag_run_id}
    if str(params.get("run_name")) != run:
        why = f"conf run_name {params.get('run_name')!r} is not the run of alert {key} ({run!r})"
        raise _refuse(store, run, CONF_DISAGREES, why, {**seen, "field": "run_name"})
    opened = _opened(store, run, schema.incident_id_for(key))
    alert, opened_at = opened if opened is not None else (_stored_alert(store, run, key, seen), None)
    if params.get("alert") and _plain(params["alert"]) != _plain(alert):
        where = "the incident's record" if opened else key
        why = f"conf alert is not the alert in {where}: the stored one is the one acted on"
        raise _refuse(store, run, CONF_DISAGREES, why, {**seen, "field": "alert"})
    named = alert.get("job_id")
    job_id = named if isinstance(named, int) and not isinstance(named, bool) else None
    claimed_job = params.get("job_id")
    if claimed_job is not None and claimed_job != job_id:
        why = f"conf job_id {claimed_job!r} is not the job alert {key} names ({job_id!r})"
        raise _refuse(store, run, CONF_DISAGREES, why, {**seen, "field": "job_id", "job_id": claimed_job})
    if job_id is None:
        signed = isinstance(alert.get(signing.SIGNATURE_FIELD), str)
        why = f"alert {key} names no Slurm job: nothing says which launch of {run} raised it"
        raise _refuse(store, run, "no_job" if signed else "unsigned", why, seen)
    launch = launch_of_job(store, run, job_id, before=opened_at)
    if launch is None:
        why = (
            f"the orchestrator recorded no launch of run {run} that ran Slurm job {job_id}"
            " (runs/<run>/launches/): its mode and spec are unknown"
        )
        raise _refuse(store, run, NO_LAUNCH_RECORD, why, {**seen, "job_id": job_id})
    claimed = dict(params.get("run_params") or {})
    try:
        wrong = differences(claimed, launch.params)
    except ValueError as e:
        wrong = [str(e)]
    if wrong:
        why = (
            f"conf run_params disagree with the launch of job {job_id} (attempt {launch.attempt},"
            f" DAG run {launch.dag_run_id}): {'; '.join(wrong)}"
        )
        raise _refuse(store, run, CONF_DISAGREES, why, {**seen, "field": "run_params", "differ": wrong})
    seen_at = params.get("alert_seen_at")
    return Incident(
        run=run,
        alert_key=key,
        alert=alert,
        job_id=job_id,
        run_params=dict(launch.params),
        dag_run_id=dag_run_id,
        alert_seen_at=float(seen_at) if seen_at is not None else None,
    )
