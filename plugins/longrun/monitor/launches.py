"""The orchestrator's record of each launch of a run: what a DAG run launched, with which params.

A run's identity is decided here, from records only the orchestrator writes, never from a DAG run's conf
(anyone allowed to trigger `training_run` or `sdc_incident` writes any conf):

- `training_run`'s preflight records a run's first launch (`record_first`): the DAG run that holds the
  name, the attempt and its declared params.
- `sdc_incident` records each relaunch (`record_relaunch`) before it triggers the `training_run` run that
  continues the run: the attempt, the Slurm job that run attaches to, the incident, the DAG run id it
  will trigger and that run's conf (`continuation_conf`, the one definition the trigger uses too).
- A `training_run` that says it continues a run (`attach_job_id` set, attempt >= 1) is believed only when
  that record exists and matches it (`check_continuation`): same run, attempt, job, DAG run id and params.
- `sdc_incident` takes the alerting launch's mode and spec from the launch of the alert's job
  (`launch_of_job`), found through the key record that binds the job to the DAG run that submitted it
  (`longrun.alert_auth.bound_tag`).

Records live at `runs/<run>/launches/<attempt>.json`, on the orchestrator's side of the store (a job's
identity can neither write nor delete them), created only if absent: a second, different record for the
same attempt is refused (LaunchConflict), never written over the first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun.alert_auth import bound_tag
from longrun.dagrun_ids import attempt_run_id
from longrun.monitor.lifecycle import ATTACH_PARAMS, conf_of, spec_from_params
from longrun.slurm.spec import JobTag
from training.records import schema
from training.records.base import Declared
from training.records.fields import (
    Field,
    at_least,
    non_empty,
    opt_dict,
    opt_float,
    opt_int,
    opt_str,
    run_name,
    slurm_job_id,
)
from training.records.schema import SchemaError
from training.store.interface import NotFound, ObjectStore, dump_json
from training.store.update import create_or_read

KIND = "run_launch"
SCHEMA_VERSION = 1
LAUNCHES_DIR = "launches/"
#: The DAG whose runs monitor a launch (the first launch's tag names it; a relaunch is sdc_incident's).
TRAINING_DAG = "training_run"


class LaunchConflict(RuntimeError):
    """A different launch is already recorded for this run and attempt; the message names both."""


class NotAContinuation(RuntimeError):
    """A `training_run` says it continues a run, and the orchestrator's records say it does not."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLaunch(Declared):
    """One launch of a run as the orchestrator recorded it. Every field is written, null where it says
    none; a field this reader does not know is kept in `extra`, written last."""

    KIND = KIND
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "attempt": Field(opt_int, checks=(at_least(0),)),
        "dag_run_id": Field(opt_str, checks=(non_empty,)),
        "job_id": Field(opt_int, need=False, present=True, checks=(slurm_job_id,)),
        "incident_id": Field(opt_str, need=False, present=True),
        "params": Field(opt_dict, need=False, present=True),
        "recorded_at": Field(opt_float),
    }

    run: str
    """The run name."""
    attempt: int
    """The launch's attempt (0 for the first; each relaunch one more)."""
    dag_run_id: str
    """The `training_run` DAG run that monitors this launch."""
    job_id: int | None
    """The Slurm job that DAG run attaches to (a relaunch); None: it submits its own (a first launch)."""
    incident_id: str | None
    """The incident that relaunched the run; None for a first launch."""
    params: Mapping[str, Any]
    """The launch's declared `training_run` params, as `normalized` writes them."""
    recorded_at: float
    """Epoch seconds."""
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields this reader does not know, kept as written."""

    def _settle(self) -> None:
        if self.params.get("run_name") != self.run:
            raise SchemaError(
                f"{KIND} record field 'params' names run {self.params.get('run_name')!r}, not {self.run!r}"
            )

    def same_launch(self, other: RunLaunch) -> bool:
        """The same launch, whenever each was recorded."""
        return (self.run, self.attempt, self.dag_run_id, self.job_id, self.incident_id) == (
            other.run,
            other.attempt,
            other.dag_run_id,
            other.job_id,
            other.incident_id,
        ) and _plain(self.params) == _plain(other.params)


def launch_key(run: str, attempt: int) -> str:
    return schema.store_key(run, f"{LAUNCHES_DIR}{int(attempt):06d}.json")


def _plain(value: Any) -> Any:
    """`value` as JSON gives it back (tuples as lists), for comparing."""
    return json.loads(json.dumps(value, sort_keys=True))


def normalized(params: Mapping[str, Any]) -> dict[str, Any]:
    """A launch's declared params in one form: the RunSpec's (defaults filled, a drill's target as text)
    plus the attach fields. UndeclaredParamError or RunSpecError (both ValueError) when they are not a
    run's params."""
    out = conf_of(spec_from_params(params))
    for name in ATTACH_PARAMS:
        out[name] = params.get(name)
    plain: dict[str, Any] = _plain(out)
    return plain


def differences(claimed: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[str]:
    """The params `claimed` sets to another value than the `recorded` launch (both normalized first):
    "name: claimed X, recorded Y" each. A claim leaves out what it does not claim."""
    mine, theirs = normalized({"run_name": recorded.get("run_name"), **claimed}), normalized(recorded)
    return [
        f"{name}: claimed {mine.get(name)!r}, recorded {theirs.get(name)!r}"
        for name in sorted(claimed)
        if mine.get(name) != theirs.get(name)
    ]


def read(store: ObjectStore, run: str, attempt: int) -> RunLaunch | None:
    try:
        return RunLaunch.from_json(store.get_bytes(launch_key(run, attempt)))
    except NotFound:
        return None


def launches(store: ObjectStore, run: str) -> list[RunLaunch]:
    """Every launch recorded for `run`, by attempt. A record that does not read raises its ValueError."""
    found = [
        RunLaunch.from_json(store.get_bytes(info.key))
        for info in store.list(schema.store_key(run, LAUNCHES_DIR))
        if info.key.endswith(".json")
    ]
    return sorted(found, key=lambda launch: launch.attempt)


def record(store: ObjectStore, launch: RunLaunch) -> RunLaunch:
    """Record `launch` (created only if absent); the record a rerun finds when it is the same launch,
    LaunchConflict when another launch holds the attempt."""
    key = launch_key(launch.run, launch.attempt)
    first = create_or_read(store, key, dump_json(launch.to_json()))
    if first.created:
        return launch
    held = RunLaunch.from_json(first.data)
    if not held.same_launch(launch):
        raise LaunchConflict(
            f"{key} already records attempt {held.attempt} of run {held.run} for DAG run"
            f" {held.dag_run_id!r} (job {held.job_id}, incident {held.incident_id}); not recording it again"
            f" for DAG run {launch.dag_run_id!r} (job {launch.job_id}, incident {launch.incident_id})"
        )
    return held


def record_first(store: ObjectStore, params: Mapping[str, Any], dag_run_id: str) -> RunLaunch:
    """The launch of the `training_run` DAG run `dag_run_id` that holds the run's name (preflight)."""
    plain = normalized(params)
    attach = plain.get("attach_job_id")
    return record(
        store,
        RunLaunch(
            run=str(plain["run_name"]),
            attempt=int(plain["attempt"]),
            dag_run_id=dag_run_id,
            job_id=None if attach is None else int(attach),
            incident_id=None,
            params=plain,
            recorded_at=time.time(),
        ),
    )


def continuation_conf(result: Mapping[str, Any]) -> dict[str, Any]:
    """The conf of the `training_run` run that continues a run after sdc_incident's relaunch step
    returned `result` (its `params`, `job_id` and `incident_id`)."""
    return {**result["params"], "attach_job_id": result["job_id"], "incident_id": result.get("incident_id")}


def record_relaunch(store: ObjectStore, result: Mapping[str, Any]) -> RunLaunch:
    """The relaunch sdc_incident's relaunch step returned as `result`, recorded before the continuation
    is triggered (as DAG run `<run>__attempt<N>`, with `continuation_conf(result)`)."""
    plain = normalized(continuation_conf(result))
    run, attempt = str(plain["run_name"]), int(plain["attempt"])
    return record(
        store,
        RunLaunch(
            run=run,
            attempt=attempt,
            dag_run_id=attempt_run_id(run, attempt),
            job_id=int(plain["attach_job_id"]),
            incident_id=str(plain["incident_id"]),
            params=plain,
            recorded_at=time.time(),
        ),
    )


def check_continuation(store: ObjectStore, params: Mapping[str, Any], dag_run_id: str) -> RunLaunch:
    """The orchestrator's record of the relaunch that the `training_run` DAG run `dag_run_id` with
    `params` says it continues; NotAContinuation, saying what differs, when there is none or it does not
    match (run, attempt, job, DAG run id, params)."""
    plain = normalized(params)
    run, attempt, job = str(plain["run_name"]), int(plain["attempt"]), plain.get("attach_job_id")
    held = read(store, run, attempt)
    claim = f"DAG run {dag_run_id!r} says it continues run {run!r} (attempt {attempt}, job {job})"
    if held is None:
        raise NotAContinuation(
            f"{claim}, but the orchestrator recorded no relaunch of attempt {attempt}"
            f" ({launch_key(run, attempt)}); only sdc_incident's relaunch may continue a run"
        )
    wrong = [
        f"{name}: claimed {mine!r}, recorded {theirs!r}"
        for name, mine, theirs in (
            ("dag_run_id", dag_run_id, held.dag_run_id),
            ("attach_job_id", job, held.job_id),
            ("incident_id", plain.get("incident_id"), held.incident_id),
        )
        if mine != theirs
    ]
    wrong += [
        f"{name}: claimed {plain.get(name)!r}, recorded {held.params.get(name)!r}"
        for name in sorted(set(plain) | set(held.params))
        if name not in ATTACH_PARAMS and plain.get(name) != held.params.get(name)
    ]
    if held.job_id is None or held.incident_id is None:
        wrong.insert(0, f"attempt {attempt} is a first launch (DAG run {held.dag_run_id!r}), not a relaunch")
    if wrong:
        raise NotAContinuation(
            f"{claim}, but the orchestrator's record {launch_key(run, attempt)} differs: {'; '.join(wrong)}"
        )
    return held


def launch_of_job(
    store: ObjectStore, run: str, job_id: int, *, before: float | None = None
) -> RunLaunch | None:
    """The launch of `run` that ran Slurm job `job_id`: the newest recorded relaunch that attaches to it
    (a hot-spare relaunch keeps the job, so it may have several), else the first launch of the
    `training_run` DAG run that submitted it (by the tag the orchestrator bound to the job id). `before`:
    only launches recorded by then (an incident's own relaunch comes after it opened). None when the
    orchestrator recorded none."""
    found = [x for x in launches(store, run) if before is None or x.recorded_at <= before]
    attached = [x for x in found if x.job_id == job_id]
    if attached:
        return attached[-1]
    tag = JobTag.parse(bound_tag(store, run=run, job_id=job_id) or "")
    if tag is None or tag.dag_id != TRAINING_DAG:
        return None
    submitted = [x for x in found if x.job_id is None and x.dag_run_id == tag.run_id]
    return submitted[-1] if submitted else None
